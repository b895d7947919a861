#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test
# (GoogleTest unit/integration tests and the PyTorch oracle) through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# The CUDA backend must compile and link wherever the toolkit is (no GPU needed).
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "test: building with -DKVS_CUDA=ON (compile and link check)"
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DKVS_CUDA=ON >/dev/null
  cmake --build build-cuda -j"$(nproc)" --target kvshift
fi
# CI runs as root; OpenMP/OpenBLAS use both cores.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
cd build
ctest --output-on-failure --timeout 1200 "$@"
