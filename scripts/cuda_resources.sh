#!/usr/bin/env bash
# Registers, spills, stack and static shared memory of every CUDA kernel, as
# ptxas reports them (-Xptxas -v), for one architecture: a host-side look at
# occupancy limits and local-memory spills before a GPU sees the code
# (docs/CUDA.md "Kernel resources"). Needs a configured build directory.
#   bash scripts/cuda_resources.sh [arch, default 90] [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-90}
build=${2:-build}
rsp=$build/CMakeFiles/kvs_cuda.dir/includes_CUDA.rsp
[ -f "$rsp" ] || { echo "cuda_resources: $rsp not found: configure $build with -DKVS_CUDA=ON first" >&2; exit 1; }
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-22s %-44s %5s %7s %7s %6s\n' file kernel regs spill_B stack_B smem_B
for cu in src/kernels/cuda/*.cu; do
  (cd "$build" && "$nvcc" -forward-unknown-to-host-compiler -DFMT_SHARED -DSPDLOG_COMPILED_LIB \
    -DSPDLOG_FMT_EXTERNAL -DSPDLOG_SHARED_LIB --options-file "${rsp#$build/}" -O3 -DNDEBUG \
    --generate-code=arch=compute_$arch,code=sm_$arch --expt-relaxed-constexpr -std=c++17 -x cu -c "../$cu" \
    -o "$tmp/k.o" -Xptxas -v) 2>&1 |
    /usr/bin/python3 -c '
import re, subprocess, sys
f, kernel, stack, spill = sys.argv[1], "", 0, 0
for line in sys.stdin:
    m = re.search(r"Compiling entry function .([^\x27]+)", line)
    if m: kernel = m.group(1); continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)
    if m: stack, spill = int(m.group(1)), int(m.group(2)); continue
    m = re.search(r"Used (\d+) registers", line)
    if m:
        smem = re.search(r"(\d+) bytes smem", line)
        name = subprocess.run(["c++filt", "-p", kernel], capture_output=True, text=True).stdout.strip()
        name = name.replace("kvs::cuda::(anonymous namespace)::", "").replace("kvs::cuda::", "")
        print(f"{f:22} {name[:44]:44} {int(m.group(1)):5} {spill:7} {stack:7} {int(smem.group(1)) if smem else 0:6}")
' "$(basename "$cu")"
done
