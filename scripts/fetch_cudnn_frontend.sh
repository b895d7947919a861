#!/usr/bin/env bash
# Unpacks the cuDNN frontend's C++ headers (header-only; the "cudnn" attention
# backend is built on them) into .deps/cudnn-frontend/include, where
# CMakeLists.txt looks first. They come from the PyPI wheel
# nvidia-cudnn-frontend at a pinned version (Debian does not package them);
# only its include/ folder is kept. Idempotent: nothing is downloaded when
# that version is already unpacked. Needs python3 with pip and the network.
set -euo pipefail
VERSION=1.32.0
cd "$(dirname "$0")/.."
dest=.deps/cudnn-frontend
if [ -f "$dest/include/cudnn_frontend.h" ] && [ "$(cat "$dest/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  echo "cudnn-frontend: $VERSION already in $dest"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The wheels differ only in the compiled Python module, so one fixed wheel
# serves every machine: the same headers whatever python3 runs this.
python3 -m pip download -q --retries 2 --timeout 30 --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.11 \
  --implementation cp --dest "$tmp" "nvidia-cudnn-frontend==$VERSION"
rm -rf "$dest"
mkdir -p "$dest"
python3 - "$tmp"/nvidia_cudnn_frontend-*.whl "$dest" <<'EOF'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    if not any(n == "include/cudnn_frontend.h" for n in names):
        sys.exit(f"cudnn-frontend: {wheel} has no include/cudnn_frontend.h")
    z.extractall(dest, names)
EOF
echo "$VERSION" >"$dest/VERSION"
echo "cudnn-frontend: $VERSION unpacked into $dest/include ($(du -sh "$dest" | cut -f1))"
