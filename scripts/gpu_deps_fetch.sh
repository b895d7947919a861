#!/usr/bin/env bash
# Downloads (does not install) the Debian packages the build needs into .deps/,
# so they can be carried to a GPU machine without network access, where
# scripts/gpu_check.sh unpacks them. Run on a networked Debian machine.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
grep -qx '/.deps/' .git/info/exclude 2>/dev/null || echo '/.deps/' >>.git/info/exclude
pkgs="cmake cmake-data libjsoncpp25 librhash0 libuv1 libarchive13 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
      nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev googletest libopenblas-openmp-dev libopenblas0-openmp
      libopenblas-dev libopenblas0 libgomp1"
(cd .deps && apt-get download $pkgs)
du -sh .deps
