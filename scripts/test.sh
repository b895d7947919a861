#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test
# (GoogleTest unit/integration tests, the MPI tests, the PyTorch oracle, the
# Hugging Face, script, reliability and text-pipeline tests; with CUDA also
# the host-side CUDA tests: SIMT emulator, host-built engine) through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The machine, for reading a failure later (GEMM bits follow the CPU's kernels).
cpu() { grep -m1 "^$1" /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'; }
echo "test: machine: $(cpu 'model name') (family $(cpu 'cpu family'), model $(cpu 'model'))," \
  "$(nproc) cores, $(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo 'no AVX-512')"
bash scripts/setup.sh
bash scripts/build.sh
# (build.sh compiles the CUDA backend too whenever nvcc is found: KVS_CUDA defaults to ON then.)
grep -q "KVS_CUDA:BOOL=ON" build/CMakeCache.txt && echo "test: CUDA backend compiled and linked (KVS_CUDA=ON)"
# CI runs as root; OpenMP/OpenBLAS use both cores.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
cd build
ctest --output-on-failure --timeout 1200 "$@"
