#!/usr/bin/env bash
# Installs every build and test dependency of kvshift: Debian's packages, then
# (from PyPI) the Hugging Face tests' Python venvs and the cuDNN frontend's headers.
# Idempotent: packages already present are skipped; safe to run repeatedly.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  ccache  # compiler cache: a fresh clone (CI) reuses earlier compiles (CMakeLists.txt, KVS_CCACHE)
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev
  libopenblas-openmp-dev
  libdnnl-dev  # oneDNN: dnnl_sgemm, the CPU GEMMs on CPUs with AVX-512 (src/kernels/cpu/gemm_library.h)
  libssl-dev  # OpenSSL's libcrypto: SHA-256 (src/core/sha256.cpp)
  libxxhash-dev  # XXH3 checksums of checkpoint files (src/core/checksum.cpp)
  zlib1g-dev libzstd-dev  # .gz and .zst corpus files in tokenizer train / data prepare (src/data/compressed_input.h)
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

# The Python environments for the Hugging Face tests, built once per requirements file in a
# shared cache and linked into the clone: .venv-hf5 is 4.7 GB and 2-3 minutes of pip, and CI
# tests a fresh clone every time. KVS_VENV_CACHE picks the cache (default
# $XDG_CACHE_HOME/kvshift/venvs, else ~/.cache/kvshift/venvs); KVS_VENV_CACHE= (empty) builds
# them inside the clone instead. A venv already in the clone and up to date is kept.
# KVS_SKIP_HF_VENV=1 skips them (offline machines): the tests then say what they skipped.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_CACHE="${KVS_VENV_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/kvshift/venvs}"

# setup_venv NAME REQUIREMENTS WHAT PIP_OPTIONS VENV_OPTIONS...
setup_venv() {
  local name=$1 req=$2 what=$3 pip_opts=$4
  shift 4
  local link="$ROOT/$name" dir="$ROOT/$name" lock_fd=""
  if [ "${KVS_SKIP_HF_VENV:-0}" = 1 ]; then
    echo "setup: skipping $name (KVS_SKIP_HF_VENV=1)"
    return
  fi
  if [ ! -L "$link" ] && [ -x "$link/bin/python" ] && cmp -s "$req" "$link/.requirements"; then
    echo "setup: $name up to date"
    return
  fi
  if [ -n "$VENV_CACHE" ]; then
    # Keyed by what goes into it: the requirements, the venv options and the Python.
    local key
    key=$({ cat "$req"; echo "$pip_opts $*"; /usr/bin/python3 -V; } | sha256sum | cut -c1-16)
    dir="$VENV_CACHE/${name#.}-$key"
    mkdir -p "$VENV_CACHE"
    exec {lock_fd}>"$dir.lock"
    flock "$lock_fd"  # two setups at once build it once
  fi
  if [ -x "$dir/bin/python" ] && cmp -s "$req" "$dir/.requirements"; then
    echo "setup: $name up to date ($dir)"
  else
    echo "setup: creating $name ($what, from PyPI) in $dir"
    rm -rf "$dir"
    /usr/bin/python3 -m venv "$@" "$dir"
    # shellcheck disable=SC2086
    if "$dir/bin/pip" install -q $pip_opts -r "$req"; then
      cp "$req" "$dir/.requirements"  # written last: marks the venv complete
    else
      rm -rf "$dir"
      echo "setup: warning: pip could not install ${req#"$ROOT"/}; the tests that need $name" \
           "will say what they skipped" >&2
    fi
  fi
  if [ -n "$lock_fd" ]; then exec {lock_fd}>&-; fi
  if [ "$dir" != "$link" ]; then
    rm -rf "$link"
    if [ -d "$dir" ]; then ln -s "$dir" "$link"; fi
  fi
}

# .venv-hf: Hugging Face transformers (not packaged by Debian) on top of the system Python, so it
# sees Debian's torch 1.13, with pinned versions. Without it the HF tests use the modeling file's
# pure-torch core.
setup_venv .venv-hf "$ROOT/scripts/hf-requirements.txt" "transformers for torch 1.13" "" --system-site-packages
# .venv-hf5: the current transformers line (5.x) on torch 2.x, both from PyPI, with
# lm-evaluation-harness, in a venv of its own (its torch is not Debian's), so the HF tests run
# against both lines (docs/HF.md "Tests"). PyPI has no CPU-only torch for Linux x86_64; the
# requirements are installed with --no-deps so that only what a CPU-only machine loads comes in
# (about 4.7 GB, 2 minutes). Without it those tests report themselves skipped.
setup_venv .venv-hf5 "$ROOT/scripts/hf5-requirements.txt" "transformers 5.x, torch 2.x, lm_eval" "--no-deps"
# The cuDNN frontend's headers for the "cudnn" attention backend (CUDA builds):
# pinned, from PyPI, into the git-ignored .deps/. Optional: without them
# CMake builds without that backend. KVS_SKIP_CUDNN_FRONTEND=1 skips it.
if [ "${KVS_SKIP_CUDNN_FRONTEND:-0}" = 1 ]; then
  echo "setup: skipping the cuDNN frontend headers (KVS_SKIP_CUDNN_FRONTEND=1)"
elif ! bash "$ROOT/scripts/fetch_cudnn_frontend.sh"; then
  echo "setup: warning: no cuDNN frontend headers; the \"cudnn\" attention backend will not be built" >&2
fi
echo "setup: done"
