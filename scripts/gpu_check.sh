#!/usr/bin/env bash
# Builds, tests and benchmarks everything on a machine with an NVIDIA GPU and
# prints one short table. Today the CUDA engine does not exist yet (issue 4):
# the script checks that the CUDA build compiles, links and sees the GPU, runs
# every test (CPU), and benchmarks the CPU engine for reference.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
row() { printf '%-34s %s\n' "$1" "$2"; }

bash scripts/setup.sh >"$out/setup.log" 2>&1 || { echo "setup failed: $out/setup.log"; exit 1; }
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKVS_CUDA=ON >"$out/cmake.log" 2>&1 &&
  cmake --build build-gpu -j"$(nproc)" >"$out/build.log" 2>&1
build_rc=$?
gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
tests="not run"
if [ $build_rc -eq 0 ]; then
  (cd build-gpu && ctest -j4 >"$out/ctest.log" 2>&1)
  tests=$(grep -E "tests passed" "$out/ctest.log" || echo "see $out/ctest.log")
fi
cuda_probe=$(./build-gpu/kvshift bench --device cuda --config configs/toy/induction-1l-kvshift.json 2>&1 | tail -1)
cpu_bench=$(./build-gpu/kvshift bench --json --config configs/toy/lm-small-kvshift.json 2>/dev/null |
  python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.0f tokens/s, %.1f ms/step (%s, %d threads)" % (j["tokens_per_s"], j["median_ms_per_step"], j["openblas_core"], j["threads"]))' 2>/dev/null)

echo
row "GPU" "${gpu:-none found}"
row "CUDA build (KVS_CUDA=ON)" "$([ $build_rc -eq 0 ] && echo ok || echo "FAILED: $out/build.log")"
row "tests" "$tests"
row "--device cuda" "$cuda_probe"
row "CPU engine, lm-small" "${cpu_bench:-n/a}"
echo "logs: $out"
