#!/usr/bin/env bash
# Installs every build and test dependency of kvshift from Debian's packages.
# Idempotent: packages already present are skipped; safe to run repeatedly.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev
  libopenblas-openmp-dev
  openmpi-bin libopenmpi-dev
  python3 python3-torch python3-numpy python3-matplotlib
  # the tokenizer: sentencepiece's C++ library (training + encoding), its CLI and Python module
  libsentencepiece-dev sentencepiece python3-sentencepiece
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
