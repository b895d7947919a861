#!/usr/bin/env bash
# Installs every build and test dependency of kvshift from Debian's packages.
# Idempotent: packages already present are skipped; safe to run repeatedly.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  ccache  # compiler cache: a fresh clone (CI) reuses earlier compiles (CMakeLists.txt, KVS_CCACHE)
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev
  libopenblas-openmp-dev
  libssl-dev  # OpenSSL's libcrypto: SHA-256 (src/core/sha256.cpp)
  libxxhash-dev  # XXH3 checksums of checkpoint files (src/core/checksum.cpp)
  python3-venv  # .venv-hf (transformers), below
  python3-pip   # the cuDNN frontend's headers (scripts/fetch_cudnn_frontend.sh), below
  openmpi-bin libopenmpi-dev
  python3 python3-torch python3-numpy python3-matplotlib
  # the tokenizer: sentencepiece's C++ library (training + encoding), its CLI and Python module
  libsentencepiece-dev sentencepiece python3-sentencepiece
  # the real-text corpus (scripts/prepare_corpus.sh): the kernel's English documentation, 21 MB of .rst text
  linux-doc
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Hugging Face transformers is not packaged by Debian: a venv on top of the
# system python (so it sees Debian's torch 1.13) with pinned versions from PyPI.
# Optional: without it the HF tests use the modeling file's pure-torch core.
# KVS_SKIP_HF_VENV=1 skips it (offline machines).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-hf"
REQ="$ROOT/scripts/hf-requirements.txt"
if [ "${KVS_SKIP_HF_VENV:-0}" = 1 ]; then
  echo "setup: skipping .venv-hf (KVS_SKIP_HF_VENV=1)"
elif [ -x "$VENV/bin/python" ] && cmp -s "$REQ" "$VENV/.requirements"; then
  echo "setup: .venv-hf up to date"
else
  echo "setup: creating .venv-hf (transformers for torch 1.13, from PyPI)"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
  if "$VENV/bin/pip" install -q -r "$REQ"; then
    cp "$REQ" "$VENV/.requirements"
  else
    echo "setup: warning: pip could not install scripts/hf-requirements.txt; HF tests will use the pure-torch core" >&2
  fi
fi
# The current transformers line (5.x) on torch 2.x, both from PyPI, with lm-evaluation-harness:
# a venv of its own (no system site packages: its torch is not Debian's), so the HF tests run
# against both lines (docs/HF.md "Tests"). PyPI has no CPU-only torch for Linux x86_64; the
# requirements are installed with --no-deps so that only what a CPU-only machine loads comes in
# (about 4.7 GB, 2 minutes). Optional: without it those tests report themselves skipped.
# KVS_SKIP_HF_VENV=1 skips it too.
VENV5="$ROOT/.venv-hf5"
REQ5="$ROOT/scripts/hf5-requirements.txt"
if [ "${KVS_SKIP_HF_VENV:-0}" = 1 ]; then
  echo "setup: skipping .venv-hf5 (KVS_SKIP_HF_VENV=1)"
elif [ -x "$VENV5/bin/python" ] && cmp -s "$REQ5" "$VENV5/.requirements"; then
  echo "setup: .venv-hf5 up to date"
else
  echo "setup: creating .venv-hf5 (transformers 5.x, torch 2.x, lm_eval; from PyPI)"
  rm -rf "$VENV5"
  /usr/bin/python3 -m venv "$VENV5"
  if "$VENV5/bin/pip" install -q --no-deps -r "$REQ5"; then
    cp "$REQ5" "$VENV5/.requirements"
  else
    rm -rf "$VENV5"
    echo "setup: warning: pip could not install scripts/hf5-requirements.txt; the transformers 5.x and lm_eval" \
         "tests will report themselves skipped" >&2
  fi
fi
# The cuDNN frontend's headers for the "cudnn" attention backend (CUDA builds):
# pinned, from PyPI, into the git-ignored .deps/. Optional: without them
# CMake builds without that backend. KVS_SKIP_CUDNN_FRONTEND=1 skips it.
if [ "${KVS_SKIP_CUDNN_FRONTEND:-0}" = 1 ]; then
  echo "setup: skipping the cuDNN frontend headers (KVS_SKIP_CUDNN_FRONTEND=1)"
elif ! bash "$ROOT/scripts/fetch_cudnn_frontend.sh"; then
  echo "setup: warning: no cuDNN frontend headers; the \"cudnn\" attention backend will not be built" >&2
fi
echo "setup: done"
