#!/usr/bin/env bash
# Downloads (does not install) the Debian packages the build needs into .deps/,
# and unpacks the cuDNN frontend's headers into .deps/cudnn-frontend/, so they
# can be carried to a GPU machine without network access, where
# scripts/gpu_check.sh unpacks the packages and points CMake at the headers.
# Run on a networked Debian machine.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.deps/' "$exclude" 2>/dev/null || echo '/.deps/' >>"$exclude"
pkgs="cmake cmake-data libjsoncpp25 librhash0 libuv1 libarchive13 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
      nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev googletest libopenblas-openmp-dev libopenblas0-openmp
      libopenblas-dev libopenblas0 libgomp1 libdnnl-dev libdnnl2 ocl-icd-libopencl1
      openmpi-bin openmpi-common libopenmpi-dev libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
      libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libnuma1
      libmunge2 libxnvctrl0 libltdl7
      pkg-config pkgconf pkgconf-bin libpkgconf3 libsentencepiece-dev libsentencepiece0
      libgfortran5 libquadmath0 libudev1 zlib1g zlib1g-dev libzstd-dev libzstd1
      libssl-dev libssl3 libxxhash-dev libxxhash0"
(cd .deps && apt-get download $pkgs)
bash scripts/fetch_cudnn_frontend.sh
du -sh .deps
