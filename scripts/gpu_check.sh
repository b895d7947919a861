#!/usr/bin/env bash
# Builds, tests and benchmarks everything on a machine with an NVIDIA GPU and
# prints one short table (docs/CUDA.md). The lent GPU machines have no network:
# run scripts/gpu_deps_fetch.sh on a networked machine first, carry .deps/
# along, and this script unpacks it when the build dependencies are missing.
#   usage: scripts/gpu_check.sh [--quick] [--only SECTIONS]
#     --quick          toy benchmarks only (no 1.5B rows; attention at T = 1024, 2048)
#     --only a,b,...   run only these sections, in this order of priority:
#                      build cuda sanitize bench attention launch dp pp hf ctest
#                      (default: all). A lent machine gives one command at most
#                      10 minutes and a session 15 minutes in all (its start
#                      included), so run it in three pieces on one warm machine:
#                        --only build,cuda,attention   then   --only bench
#                        then   --only launch,dp,pp,sanitize,hf
#                      (H100, 2026-11-27: 218 s, then the bench section about
#                      300 s, 340 s with both 1.5B configs profiled since:
#                      KVS_CHECK_BUDGET=400 for it; then launch,dp,pp 40 s;
#                      since 2026-11-29 the bench section also times the 1.5B
#                      step with AdamW in order and overlapped, about 40 s more:
#                      430 s on an H200 that day, and its last row, flash-mma,
#                      was cut; since then the timed GEMM algorithms' row,
#                      before the profile, adds about 45 s more. The H200 run
#                      of 2026-11-29 fit 797 s of its 900: build,cuda,attention
#                      at KVS_CHECK_BUDGET=270 (259 s), dp,launch,pp at 190
#                      (48 s), bench at 430; sanitize and hf did not fit.
#                      That no longer fits: the next session runs
#                        --only build,cuda (KVS_CHECK_BUDGET=300), then
#                        --only dp,pp,launch (120), then --only bench with
#                      what is left; attention waits)
#                      the build in build-gpu/ and the logs in build-gpu/check/
#                      stay on the machine between calls while it is warm
#                      (30 s idle: start the next call at once).
# KVS_CHECK_BUDGET (default 560 s): the whole call's deadline; every section is cut to it.
# KVS_CHECK_BUILD, KVS_CHECK_DEVICE, KVS_CHECK_STEPS: the host rehearsal's settings (below).
# Logs: build-gpu/check/ (KVS_CHECK_LOGS overrides); the table is appended to
# its summary.txt. With $OUT set (the device tool), summary.txt and a
# logs.tar.gz of the *.log, *.jsonl and *.txt files (each under 4 MB) are
# copied there at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
only="build,cuda,sanitize,bench,attention,launch,dp,pp,hf,ctest"
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --only) only=${2:?--only needs a list}; shift ;;
    --only=*) only=${1#--only=} ;;
    *) echo "usage: $0 [--quick] [--only build,cuda,sanitize,bench,attention,launch,dp,pp,hf,ctest]" >&2; exit 2 ;;
  esac
  shift
done
want() { case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# A rehearsal on a host without a GPU (tests/test_gpu_check_rehearsal.py, in
# CI): KVS_CHECK_BUILD names a build to use instead of build-gpu/ and
# KVS_CHECK_DEVICE=cpu runs every training run and benchmark on the CPU engine,
# so the script's own flags, parsing and rows are checked before a lease's
# minutes go to them.
bd=${KVS_CHECK_BUILD:-build-gpu}
case $bd in /*) ;; *) bd=$PWD/$bd ;; esac
dev=${KVS_CHECK_DEVICE:-cuda}
steps=${KVS_CHECK_STEPS:-50}  # of every short training run (the rehearsal takes fewer)
out=${KVS_CHECK_LOGS:-$bd/check}
mkdir -p "$out"
summary=$out/summary.txt
row() { printf '%-44s  %s\n' "$1" "$2" | tee -a "$summary"; }  # label, two spaces at least, value
t0=$(date +%s)
# One deadline for the whole call (a lent machine kills a command at 10
# minutes and nothing comes back): every section's timeout is capped by the
# seconds left, so the summary and logs are always written in time.
deadline=$((t0 + ${KVS_CHECK_BUDGET:-560}))
cap() { local left=$((deadline - $(date +%s))); [ "$left" -lt 1 ] && left=1; echo $(($1 < left ? $1 : left)); }
bundle() {  # the summary and the logs, back through the device tool's $OUT
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  cp "$summary" "$OUT/summary.txt" 2>/dev/null
  (cd "$out" && find . \( -name '*.log' -o -name '*.jsonl' -o -name '*.txt' \) -size -4M -print0 |
    tar czf "$OUT/logs.tar.gz" --null -T -) 2>/dev/null
}
trap bundle EXIT
echo "== gpu_check $(date -u +%FT%TZ) sections: $only" >>"$summary"

# ---------------------------------------------------------------- dependencies
# Unpacks the carried .deb files that the machine lacks. Packages dpkg already
# has are skipped (an older Debian library unpacked over the image's own can
# break the image: the device notes say to unpack elsewhere than /), and so is
# cmake when one is on PATH. dpkg -x runs no maintainer scripts, so the
# update-alternatives links (/usr/bin/mpicxx, mpirun, ...) are made here.
mpi_cmake_args=()
mpirun_bin=mpirun
unpack_deps() {
  local f pkg unpacked=() skipped=() t
  for f in .deps/*.deb; do
    pkg=$(dpkg-deb -f "$f" Package 2>/dev/null || basename "$f")
    # Ubuntu 24.04 renamed many library packages with a t64 suffix
    # (libopenmpi3t64, libpmix2t64, ...): unpacking Debian's over them mixes
    # two builds of one library (mpirun then crashed in libpmix on the H200 image).
    if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' ||
      dpkg-query -W -f='${Status}' "${pkg}t64" 2>/dev/null | grep -q 'ok installed'; then
      skipped+=("$pkg")
      continue
    fi
    case $pkg in cmake | cmake-data) if command -v cmake >/dev/null; then skipped+=("$pkg"); continue; fi ;; esac
    # Ubuntu names it libssl3t64: its libcrypto.so.3 serves our headers, do not overwrite it.
    case $pkg in libssl3) if [ -e /usr/lib/x86_64-linux-gnu/libcrypto.so.3 ]; then skipped+=("$pkg"); continue; fi ;; esac
    dpkg -x "$f" / && unpacked+=("$pkg")
  done
  for t in mpicc mpicxx mpic++ mpiCC mpirun mpiexec; do
    if [ ! -e /usr/bin/$t ] && [ -e /usr/bin/$t.openmpi ]; then ln -sf $t.openmpi /usr/bin/$t; fi
  done
  ldconfig
  echo "unpacked: ${unpacked[*]:-none}" >"$out/deps.log"
  echo "skipped (already there): ${skipped[*]:-none}" >>"$out/deps.log"
  # Our OpenMPI, not another one that may come first on PATH.
  case " ${unpacked[*]:-} " in
    *" libopenmpi-dev "*)
      mpi_cmake_args=(-DMPI_CXX_COMPILER=/usr/bin/mpicxx.openmpi -DMPI_C_COMPILER=/usr/bin/mpicc.openmpi)
      mpirun_bin=/usr/bin/mpirun.openmpi ;;
  esac
}
# What CMakeLists.txt needs and a bare image may lack, named before cmake runs
# (a failed configure costs minutes of a short lease).
preflight() {
  local missing=()
  command -v cmake >/dev/null || missing+=("cmake (cmake, cmake-data)")
  command -v pkg-config >/dev/null || missing+=("pkg-config (Debian: pkg-config pkgconf pkgconf-bin libpkgconf3)")
  [ -f /usr/include/spdlog/spdlog.h ] || missing+=("spdlog (libspdlog-dev libspdlog1.10 libfmt-dev libfmt9)")
  [ -f /usr/include/sentencepiece_processor.h ] || missing+=("sentencepiece (libsentencepiece-dev libsentencepiece0)")
  [ -e /usr/include/gtest/gtest.h ] || missing+=("googletest (libgtest-dev libgmock-dev googletest)")
  [ -f /usr/include/openssl/evp.h ] || missing+=("OpenSSL's libcrypto (libssl-dev libssl3)")
  [ -f /usr/include/oneapi/dnnl/dnnl.h ] || missing+=("oneDNN (libdnnl-dev libdnnl2 ocl-icd-libopencl1)")
  command -v mpicxx >/dev/null || [ -e /usr/bin/mpicxx.openmpi ] || missing+=("OpenMPI (libopenmpi-dev openmpi-bin ...)")
  # Shared libraries the unpacked ones need at run time (kvshift_tests runs at
  # build time too, to list its tests): OpenBLAS needs gfortran's runtime, hwloc
  # needs libudev, ... A missing one fails the link step or every test.
  local lib so
  for lib in /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0 /usr/lib/x86_64-linux-gnu/libmpi.so.40 \
    /usr/lib/x86_64-linux-gnu/libspdlog.so.1* /usr/lib/x86_64-linux-gnu/libsentencepiece*.so.0 \
    /usr/lib/x86_64-linux-gnu/libdnnl.so.2; do
    [ -e "$lib" ] || continue
    for so in $(ldd "$lib" 2>/dev/null | awk '/not found/ {print $1}'); do
      missing+=("$so, needed by $(basename "$lib") (Debian: libgfortran5 libquadmath0 libudev1 zlib1g ...)")
    done
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "missing build dependencies (add them to scripts/gpu_deps_fetch.sh and carry .deps/):" | tee -a "$out/deps.log"
    printf '  %s\n' "${missing[@]}" | tee -a "$out/deps.log"
    return 1
  fi
}
# CMake records whether it found NCCL (CMakeLists.txt): without it the build
# is for one GPU in one process, and the NCCL rows cannot run.
nccl_built() { grep -q '^KVS_BUILT_WITH_NCCL:INTERNAL=ON' "$bd"/CMakeCache.txt 2>/dev/null; }
# NCCL: the toolkit's, the system's, or the pip wheel's that PyTorch brings.
nccl_cmake_args=()
find_nccl() {
  local d lib
  for d in /usr/local/cuda/include /usr/include /usr/local/include; do [ -f $d/nccl.h ] && return 0; done
  d=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null) || return 0
  lib=$(ls "$d"/lib/libnccl.so* 2>/dev/null | head -1)
  [ -f "$d/include/nccl.h" ] && [ -n "$lib" ] && nccl_cmake_args=(-DKVS_NCCL_INCLUDE="$d/include" -DKVS_NCCL_LIB="$lib")
}

# The cuDNN frontend's headers for the "cudnn" attention backend: carried in
# .deps/ (scripts/gpu_deps_fetch.sh), since the image has no such package.
fe_cmake_args=()
if [ -f .deps/cudnn-frontend/include/cudnn_frontend.h ]; then
  fe_cmake_args=(-DKVS_CUDNN_FRONTEND_INCLUDE:PATH="$PWD/.deps/cudnn-frontend/include")
fi

export PATH=/usr/local/cuda/bin:$PATH
build_rc=0
if want build; then
  tb=$(date +%s)
  # Carried packages are always unpacked (unpack_deps skips what dpkg has): an
  # image may have most of the libraries and still lack one (libxxhash).
  if ls .deps/*.deb >/dev/null 2>&1; then
    unpack_deps
  elif ! command -v cmake >/dev/null || [ ! -f /usr/include/spdlog/spdlog.h ] ||
    [ ! -f /usr/include/sentencepiece_processor.h ] || [ ! -f /usr/include/openssl/evp.h ] ||
    ! command -v mpicxx >/dev/null || [ ! -f /usr/include/xxhash.h ]; then
    bash scripts/setup.sh >"$out/setup.log" 2>&1 || echo "setup failed and no .deps/: $out/setup.log"
  fi
  find_nccl
  # Only the two binaries the sections run: the host-emulator targets (the
  # SIMT emulator, the ASan-instrumented host engine and their tests, CI's
  # job) would take about as long again. `ctest` needs them all.
  build_targets=(--target kvshift kvshift_tests)
  want ctest && build_targets=()
  rm -f "$out/cmake.log" "$out/build.log"
  if preflight; then
    # CMAKE_POLICY_VERSION_MINIMUM: a pip CMake 4 on the image refuses package
    # config files that still ask for policies below 3.5 (3.x ignores it).
    # Only this GPU's architecture (e.g. 9.0 -> 90): half the nvcc time of "80;90a". Hopper (9.0)
    # as 90a, its arch-specific target: the wgmma kernels (flash_attention_fwd_sm90.cu) need it.
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    [ "$arch" = 90 ] && arch=90a
    cmake -S . -B "$bd" -DCMAKE_BUILD_TYPE=Release -DKVS_CUDA=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      ${arch:+-DKVS_CUDA_ARCHS=$arch} \
      "${mpi_cmake_args[@]}" "${nccl_cmake_args[@]}" "${fe_cmake_args[@]}" \
      >"$out/cmake.log" 2>&1 && cmake --build "$bd" -j"$(nproc)" "${build_targets[@]}" >"$out/build.log" 2>&1
    build_rc=$?
  else
    build_rc=1
  fi
  if [ $build_rc -ne 0 ]; then
    echo "--- last lines of the configure/build log:"
    tail -25 "$out/build.log" 2>/dev/null || tail -25 "$out/cmake.log" 2>/dev/null
  fi
  row "CUDA build (KVS_CUDA=ON)" "$([ $build_rc -eq 0 ] && echo "ok ($(($(date +%s) - tb)) s, NCCL $(nccl_built && echo yes || echo "NOT FOUND: one GPU, one process"))" || echo "FAILED: $out/cmake.log, build.log")"
elif [ ! -x "$bd"/kvshift ] || [ ! -x "$bd"/kvshift_tests ]; then
  build_rc=1
  row "CUDA build" "not built: run with --only build first"
fi
[ -e /usr/bin/mpirun.openmpi ] && ! command -v mpirun >/dev/null && mpirun_bin=/usr/bin/mpirun.openmpi
# Shared memory without the CMA single copy (fails in containers), one thread per rank.
mpi_env=(OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1)
# cuDNN (optional, for attention backend "cudnn"; built when CMake found both
# cuDNN and the frontend's headers): a pip wheel's libcudnn.so.9 loads its
# engine libraries from its own directory, which the loader may not search.
cudnn_lib=$(sed -n 's/^KVS_CUDNN_LIB:[A-Z]*=//p' "$bd"/CMakeCache.txt 2>/dev/null)
cudnn_fe=$(sed -n 's/^KVS_CUDNN_FRONTEND_INCLUDE:[A-Z]*=//p' "$bd"/CMakeCache.txt 2>/dev/null)
cudnn_row="not found: backend not built"
if [ -n "$cudnn_lib" ] && [ "${cudnn_lib%NOTFOUND}" = "$cudnn_lib" ]; then
  export LD_LIBRARY_PATH="$(dirname "$cudnn_lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ -n "$cudnn_fe" ] && [ "${cudnn_fe%NOTFOUND}" = "$cudnn_fe" ]; then
    cudnn_row="$cudnn_lib, frontend $(cat "$cudnn_fe/../VERSION" 2>/dev/null || echo "$cudnn_fe")"
  else
    cudnn_row="no cuDNN frontend headers (.deps/cudnn-frontend: scripts/gpu_deps_fetch.sh): backend not built"
    cudnn_lib=""
  fi
else
  cudnn_lib=""
fi
gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
row "GPU" "${gpu:-none found}"
row "cuDNN (attention backend \"cudnn\")" "$cudnn_row"

if [ $build_rc -eq 0 ] && want cuda; then
  # The CUDA tests first: they are what this machine is for (the rest pass in CI).
  # One process per test suite, so that a fault that corrupts the CUDA context
  # (an illegal address) or a hang fails only its own suite; all of it inside
  # the lease's 10-minute command limit (KVS_CUDA_TIMEOUT seconds in all,
  # default 480), so the summary and logs still come back.
  tc=$(date +%s)
  budget=$(cap "${KVS_CUDA_TIMEOUT:-480}")
  : >"$out/cuda_tests.log"
  suites=$("$bd"/kvshift_tests --gtest_list_tests --gtest_filter="${KVS_CUDA_FILTER:-Cuda*}" 2>/dev/null |
    sed -n 's/^\([A-Za-z0-9_/]*\)\.$/\1/p')
  hung=()
  for suite in $suites; do
    left=$((budget - ($(date +%s) - tc)))
    if [ $left -le 5 ]; then
      echo "[  SKIPPED ] $suite.* (out of time: KVS_CUDA_TIMEOUT=$budget)" >>"$out/cuda_tests.log"
      hung+=("$suite (not run)")
      continue
    fi
    # A suite filter that keeps the caller's negative patterns (after '-').
    filter="$suite.*"
    case ${KVS_CUDA_FILTER:-} in *-*) filter="$suite.*-${KVS_CUDA_FILTER#*-}" ;; esac
    timeout $(cap $((left < 240 ? left : 240))) "$bd"/kvshift_tests --gtest_filter="$filter" >>"$out/cuda_tests.log" 2>&1
    rc=$?
    if [ $rc -eq 124 ]; then hung+=("$suite (timed out)"); echo "[  FAILED  ] $suite (timed out)" >>"$out/cuda_tests.log"
    elif [ $rc -gt 1 ]; then hung+=("$suite (exit $rc)"); echo "[  FAILED  ] $suite (exit status $rc)" >>"$out/cuda_tests.log"
    fi
  done
  row "CUDA tests (${KVS_CUDA_FILTER:-Cuda*}), a process per suite" "$(grep -cE '^\[       OK \]' "$out/cuda_tests.log") passed, $(grep -cE '^\[  FAILED  \] [A-Z][A-Za-z0-9_/]*\.[A-Za-z0-9_/]+ \(' "$out/cuda_tests.log") failed, $(grep -cE '^\[  SKIPPED \] [A-Z][A-Za-z0-9_/]*\.[A-Za-z0-9_/]+ \(' "$out/cuda_tests.log") skipped ($(($(date +%s) - tc)) s)"
  [ ${#hung[@]} -gt 0 ] && row "CUDA test suites cut short" "${hung[*]}"
  grep -E '^\[  FAILED  \] [A-Z]' "$out/cuda_tests.log" | sort -u | head -20
fi

# compute-sanitizer (the GPU image has it): memcheck on the kernel and engine
# tests (out-of-bounds and misaligned accesses, which the host emulator cannot
# see), racecheck on the attention kernels (shared-memory races between
# barriers). Slow: run it in its own call (--only sanitize).
if [ $build_rc -eq 0 ] && want sanitize; then
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -z "$cs" ]; then
    row "compute-sanitizer" "not found"
  else
    ts=$(date +%s)
    sanitize() {  # tool, gtest filter, log name
      timeout "$(cap "${KVS_SANITIZE_TIMEOUT:-240}")" "$cs" --tool "$1" --error-exitcode 99 --print-limit 20 \
        "$bd"/kvshift_tests --gtest_filter="$2" >"$out/$3" 2>&1
      case $? in
        0) echo "clean" ;;
        124) echo "timed out (KVS_SANITIZE_TIMEOUT=${KVS_SANITIZE_TIMEOUT:-240}): $out/$3" ;;
        99) echo "ERRORS: $(grep -m1 -E 'ERROR SUMMARY|Invalid|Race' "$out/$3")" ;;
        *) echo "tests failed under the tool: $(grep -m1 -E '^\[  FAILED  \] [A-Z]' "$out/$3" || tail -1 "$out/$3")" ;;
      esac
    }
    row "memcheck: kernels" "$(CUDA_LAUNCH_BLOCKING=1 sanitize memcheck \
      'CudaAdamW*:CudaConvert*:CudaCrossEntropy*:CudaEmbedding*:CudaMatmul*:CudaReduce*:CudaRmsNorm*:CudaShiftRope*:CudaSwiGLU*:CudaAttention*:CudaHopperBlocks*' \
      memcheck_kernels.log)"
    row "memcheck: engine" "$(KVS_CUDA_SYNC=1 sanitize memcheck 'CudaEngine*' memcheck_engine.log)"
    row "racecheck: attention" "$(sanitize racecheck 'CudaAttention*:CudaHopperBlocks*' racecheck_attention.log)"
    row "sanitizer time" "$(($(date +%s) - ts)) s"
  fi
fi

# Runs "$@" as $1 ranks on this node: under `torchrun --no_python` when the
# machine has a working one (Debian's torch 1.13 torchrun crashes on Python 3.11),
# else with torchrun's variables set by hand (all that kvshift reads from
# torchrun). Output of every rank in $3. Underscore options: torchrun < 2.0 has
# no dashed forms, later ones accept both.
export KVS_BOOTSTRAP_TIMEOUT_S=60
launcher="torchrun variables"
if { want launch || want dp; } &&
  timeout $(cap 120) torchrun --no_python --nproc_per_node 1 --master_port 29590 true >"$out/torchrun_probe.log" 2>&1; then
  launcher=torchrun
fi
torchrun_like() {
  local n=$1 port=$2 log=$3 pids=() rc=0 r
  shift 3
  if [ "$launcher" = torchrun ]; then
    timeout $(cap 300) torchrun --no_python --nproc_per_node "$n" --master_port "$port" "$@" >"$log" 2>&1
    return
  fi
  for ((r = 0; r < n; r++)); do
    env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout $(cap 300) "$@" >"$log.$r" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do wait "${pids[$r]}" || rc=1; done
  cat "$log".* >"$log"
  rm -f "$log".*
  return $rc
}
why() { grep -m1 'kvshift: error' "$1" || tail -1 "$1"; }
launch_rows() {  # the torchrun path on the GPU (docs/LAUNCH.md)
  local log=$out/nccl_w1.log ngpu
  if ! nccl_built; then
    row "NCCL rows ($launcher)" "not run: built without NCCL (cmake.log: NCCL not found)"
    return 0
  fi
  if torchrun_like 1 29600 "$log" "$bd"/kvshift dist-check --nccl; then
    row "NCCL world of 1 ($launcher)" "$(grep -m1 'NCCL all-reduce' "$log")"
  else
    row "NCCL world of 1 ($launcher)" "FAILED: $(why "$log")"
  fi
  # Two ranks: one GPU each when there are two; on one GPU NCCL normally refuses
  # two ranks of a communicator on the same device ("Duplicate GPU detected").
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  log=$out/nccl_w2.log
  if torchrun_like 2 29610 "$log" "$bd"/kvshift dist-check --nccl; then
    row "NCCL 2 ranks on $ngpu GPU(s)" "ok: $(grep -m1 'NCCL all-reduce' "$log")"
  elif grep -qiE "duplicate GPU|invalid usage" "$log"; then
    row "NCCL 2 ranks on $ngpu GPU(s)" "refused by NCCL: two ranks on one GPU ($(grep -m1 -oiE 'duplicate GPU[^)]*|invalid usage' "$log"))"
  else
    row "NCCL 2 ranks on $ngpu GPU(s)" "FAILED: $(why "$log")"
  fi
  # A short training run under the same launcher (a world of one: the single-process backend).
  log=$out/torchrun_train.log
  rm -rf "$out/torchrun-train"
  if torchrun_like 1 29620 "$log" "$bd"/kvshift train --quiet \
      --config configs/toy/induction-1l-kvshift.json --set device="$dev" --set train.steps=$steps \
      --set train.eval_every=$steps --set train.checkpoint_every=$steps --run-dir "$out/torchrun-train"; then
    row "train, device $dev, world of 1 ($launcher)" "$(grep -m1 '^run ' "$log" | sed 's/^run [^:]*: //')"
  else
    row "train, device $dev, world of 1 ($launcher)" "FAILED: $(why "$log")"
    return 0
  fi
  # Its checkpoint evaluated by the CPU engine: the same validation loss as the
  # run's own last evaluation, within bf16's rounding of the GPU's arithmetic.
  local j r
  j=$(timeout $(cap 120) "$bd"/kvshift eval --checkpoint "$out/torchrun-train" --device cpu --json 2>"$out/eval_cpu.log")
  if r=$(python3 - "$out/torchrun-train/metrics.jsonl" "$j" <<'PY' 2>>"$out/eval_cpu.log"
import json, sys
run = [j["val_loss"] for j in map(json.loads, open(sys.argv[1])) if j["type"] == "eval"][-1]
cpu = json.loads(sys.argv[2])["val_loss"]
print("val_loss %.4f on the CPU, %.4f in the run: rel diff %.1e" % (cpu, run, abs(cpu - run) / abs(run)))
PY
  ); then
    row "eval on the CPU of that checkpoint" "$r"
  else
    row "eval on the CPU of that checkpoint" "FAILED: $(why "$out/eval_cpu.log")"
  fi
}

# Data parallel with ZeRO-1 on the CUDA engine (docs/PARALLEL.md): the same
# 50 steps in one process and as 2 ranks, loss curves compared. On one GPU the
# 2 ranks are MPI processes sharing it (CUDA buffers staged through the host);
# with 2+ GPUs also NCCL ranks (reduction overlapped with the backward).
dp_train() {  # dir, extra KEY=VALUE settings (space-separated), launcher-prefix...
  local dir=$1 sets=() s
  for s in $2; do sets+=(--set "$s"); done
  shift 2
  rm -rf "$dir"
  "$@" "$bd"/kvshift train --quiet --config configs/toy/induction-1l-kvshift.json --set device="$dev" \
    --set train.micro_batch_size=16 --set train.grad_accum_steps=2 --set train.steps=$steps \
    --set train.eval_every=$steps --set train.checkpoint_every=$steps "${sets[@]}" --run-dir "$dir"
}
curve_diff() {  # metrics of run A vs run B: the largest relative train-loss difference
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
def losses(p):
    return {j["step"]: j["loss"] for j in map(json.loads, open(p)) if j["type"] == "train"}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
d = max(abs(a[s] - b[s]) / abs(b[s]) for s in b)
print("%d logged losses, max rel diff %.2e vs one process, final loss %.4f" % (len(b), d, a[max(a)]))
PY
}
same_run() {  # runs A and B: "identical: ..." when their losses and last checkpoints' tensors are the same bits
  python3 - "$1" "$2" <<'PY'
import json, os, sys
def losses(d):
    return [j["loss"] for j in map(json.loads, open(os.path.join(d, "metrics.jsonl"))) if j["type"] == "train"]
def ckpt(d, name):
    root = os.path.join(d, "checkpoints")
    return open(os.path.join(root, open(os.path.join(root, "latest")).read().strip(), name), "rb").read()
a, b = sys.argv[1:3]
la, lb = losses(a), losses(b)
files = [f for f in ("model.safetensors", "optimizer.safetensors") if ckpt(a, f) != ckpt(b, f)]
if la == lb and not files:
    print("identical: %d logged losses and the checkpoint" % len(la))
else:
    print("FAILED: %s" % ("losses differ" if la != lb else "checkpoint differs: " + ", ".join(files)))
PY
}
dp_rows() {
  local ngpu log
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  if ! dp_train "$out/dp1" parallel.tp=1 >"$out/dp1.log" 2>&1; then
    row "train, device $dev, dp=1 (reference)" "FAILED: $(why "$out/dp1.log")"
    return
  fi
  log=$out/dp2_mpi.log
  if dp_train "$out/dp2-mpi" parallel.tp=1 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${mpi_env[@]}" \
      timeout $(cap 300) "$mpirun_bin" --oversubscribe --bind-to none -np 2 >"$log" 2>&1; then
    row "train $dev, 2 MPI ranks on 1 GPU (staged)" "$(curve_diff "$out/dp2-mpi" "$out/dp1")"
  else
    row "train $dev, 2 MPI ranks on 1 GPU (staged)" "FAILED: $(why "$log")"
  fi
  # train.shard_master (on by default: each rank keeps its shard of the fp32
  # master, the bf16 weights are gathered) off: the same losses and checkpoint, bit for bit.
  log=$out/dp2_mpi_whole_master.log
  if [ -f "$out/dp2-mpi/metrics.jsonl" ] &&
      dp_train "$out/dp2-mpi-whole" "parallel.tp=1 train.shard_master=false" env OMPI_ALLOW_RUN_AS_ROOT=1 \
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${mpi_env[@]}" timeout $(cap 300) "$mpirun_bin" --oversubscribe \
        --bind-to none -np 2 >"$log" 2>&1; then
    row "train $dev, 2 MPI ranks: fp32 master whole vs sharded" "$(same_run "$out/dp2-mpi-whole" "$out/dp2-mpi")"
  else
    row "train $dev, 2 MPI ranks: fp32 master whole vs sharded" "FAILED: $(why "$log")"
  fi
  # Tensor parallelism with the CUDA kernels: tp=2, then dp=2 x tp=2, as MPI
  # ranks sharing the GPU (activations all-reduced through the host).
  local np
  for np in 2 4; do
    log=$out/tp2_np$np.log
    if dp_train "$out/tp2-np$np" parallel.tp=2 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${mpi_env[@]}" \
        timeout $(cap 300) "$mpirun_bin" --oversubscribe --bind-to none -np $np >"$log" 2>&1; then
      row "train $dev, tp=2 x dp=$((np / 2)), MPI on 1 GPU" "$(curve_diff "$out/tp2-np$np" "$out/dp1")"
    else
      row "train $dev, tp=2 x dp=$((np / 2)), MPI on 1 GPU" "FAILED: $(why "$log")"
    fi
  done
  # Sequence parallelism (tp=2) and context parallelism (cp=2, the shift's
  # halo and ring attention) on the CUDA engine (first run on a GPU: the H100,
  # 2026-11-27; CI checks them through the host-built engine).
  local name sets
  for name in "tp=2 + sequence parallel" "cp=2"; do
    case $name in
      tp*) sets="parallel.tp=2 parallel.sequence_parallel=true"; log=$out/tp2_sp.log ;;
      *) sets="parallel.tp=1 parallel.cp=2"; log=$out/cp2.log ;;
    esac
    if dp_train "$out/${log##*/}.run" "$sets" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        "${mpi_env[@]}" timeout $(cap 300) "$mpirun_bin" --oversubscribe --bind-to none -np 2 >"$log" 2>&1; then
      row "train $dev, $name, MPI on 1 GPU" "$(curve_diff "$out/${log##*/}.run" "$out/dp1")"
    else
      row "train $dev, $name, MPI on 1 GPU" "FAILED: $(why "$log")"
    fi
  done
  if [ "$ngpu" -ge 2 ] && nccl_built; then
    log=$out/dp2_nccl.log
    if dp_train "$out/dp2-nccl" parallel.tp=1 torchrun_like 2 29630 "$log"; then
      row "train $dev, NCCL dp=2 on 2 GPUs (overlap)" "$(curve_diff "$out/dp2-nccl" "$out/dp1")"
    else
      row "train $dev, NCCL dp=2 on 2 GPUs (overlap)" "FAILED: $(why "$log")"
    fi
    log=$out/tp2_nccl.log
    if dp_train "$out/tp2-nccl" parallel.tp=2 torchrun_like 2 29640 "$log"; then
      row "train $dev, NCCL tp=2 on 2 GPUs" "$(curve_diff "$out/tp2-nccl" "$out/dp1")"
    else
      row "train $dev, NCCL tp=2 on 2 GPUs" "FAILED: $(why "$log")"
    fi
  else
    row "train $dev, NCCL dp=2 (overlap)" "not run: needs 2 GPUs (found $ngpu) and NCCL (built: $(nccl_built && echo yes || echo no))"
  fi
}

# Pipeline parallelism on the CUDA engine (docs/PARALLEL.md): the toy model
# with 4 layers in one process and as pp=2 stages, 1F1B and interleaved (2
# virtual stages, tied embeddings and full recomputation), loss curves
# compared (the host-built engine gives the same bits). On one GPU the 2
# stages are MPI processes sharing it (activations through pinned host
# memory); with 2+ GPUs also NCCL ranks (bf16 device buffers, ncclSend/Recv).
pp_train() {  # dir, space-separated KEY=VALUE settings, launcher-prefix...
  local dir=$1 sets=() s
  for s in $2; do sets+=(--set "$s"); done
  shift 2
  rm -rf "$dir"
  "$@" "$bd"/kvshift train --quiet --config configs/toy/induction-1l-kvshift.json --set device="$dev" \
    --set model.num_hidden_layers=4 --set train.micro_batch_size=8 --set train.grad_accum_steps=4 \
    --set train.steps=$steps --set train.eval_every=$steps --set train.checkpoint_every=$steps "${sets[@]}" --run-dir "$dir"
}
pp_rows() {
  local ngpu log
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  for tied in false true; do
    if ! pp_train "$out/pp1-$tied" "model.tie_word_embeddings=$tied" >"$out/pp1_$tied.log" 2>&1; then
      row "train $dev, 4 layers (pp reference)" "FAILED: $(why "$out/pp1_$tied.log")"
      return
    fi
  done
  log=$out/pp2_mpi.log
  if pp_train "$out/pp2-mpi" "parallel.pp=2 model.tie_word_embeddings=false" env OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${mpi_env[@]}" timeout $(cap 300) "$mpirun_bin" --oversubscribe --bind-to none -np 2 \
      >"$log" 2>&1; then
    row "train $dev, pp=2 1F1B, MPI on 1 GPU" "$(curve_diff "$out/pp2-mpi" "$out/pp1-false")"
  else
    row "train $dev, pp=2 1F1B, MPI on 1 GPU" "FAILED: $(why "$log")"
  fi
  log=$out/pp2v2_mpi.log
  if pp_train "$out/pp2v2-mpi" "parallel.pp=2 parallel.virtual_stages=2 model.tie_word_embeddings=true train.recompute=full" \
      env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${mpi_env[@]}" timeout $(cap 300) "$mpirun_bin" \
      --oversubscribe --bind-to none -np 2 >"$log" 2>&1; then
    row "train $dev, pp=2 x v2 tied recompute, MPI 1 GPU" "$(curve_diff "$out/pp2v2-mpi" "$out/pp1-true")"
  else
    row "train $dev, pp=2 x v2 tied recompute, MPI 1 GPU" "FAILED: $(why "$log")"
  fi
  if [ "$ngpu" -ge 2 ] && nccl_built; then
    log=$out/pp2_nccl.log
    if pp_train "$out/pp2-nccl" "parallel.pp=2 model.tie_word_embeddings=true" \
        torchrun_like 2 29650 "$log"; then
      row "train $dev, NCCL pp=2 1F1B on 2 GPUs" "$(curve_diff "$out/pp2-nccl" "$out/pp1-true")"
    else
      row "train $dev, NCCL pp=2 1F1B on 2 GPUs" "FAILED: $(why "$log")"
    fi
    # The interleaved order over NCCL follows the plan of rounds (pipeline_rounds).
    log=$out/pp2v2_nccl.log
    if pp_train "$out/pp2v2-nccl" "parallel.pp=2 parallel.virtual_stages=2 model.tie_word_embeddings=true train.recompute=full" \
        torchrun_like 2 29651 "$log"; then
      row "train $dev, NCCL pp=2 x v2 on 2 GPUs" "$(curve_diff "$out/pp2v2-nccl" "$out/pp1-true")"
    else
      row "train $dev, NCCL pp=2 x v2 on 2 GPUs" "FAILED: $(why "$log")"
    fi
  else
    row "train $dev, NCCL pp=2 (device buffers)" "not run: needs 2 GPUs (found $ngpu) and NCCL (built: $(nccl_built && echo yes || echo no))"
  fi
}

# The cuDNN attention backend in training: the dp=1 reference run (flash) again with
# train.attention_backend=cudnn, loss curves compared.
cudnn_rows() {
  local log=$out/train_cudnn.log
  if [ "$dev" != cuda ]; then
    row "train $dev, attention cudnn vs flash" "n/a: device $dev (cuDNN is the CUDA engine's)"
    return
  fi
  if [ -z "$cudnn_lib" ]; then
    row "train $dev, attention cudnn vs flash" "n/a: built without cuDNN"
    return
  fi
  if dp_train "$out/train-cudnn" train.attention_backend=cudnn >"$log" 2>&1; then
    if [ -f "$out/dp1/metrics.jsonl" ]; then
      row "train $dev, attention cudnn vs flash" "$(curve_diff "$out/train-cudnn" "$out/dp1")"
    else
      row "train $dev, attention cudnn" "ran; no flash reference run to compare"
    fi
  else
    row "train $dev, attention cudnn" "FAILED: $(why "$log")"
  fi
}

# `kvshift bench --json "$@"` as summary rows: tokens/s, MFU, memory (and the
# shift's overhead with --compare-shift); with --profile (on CUDA each kernel's
# and GEMM's GPU time from CUDA events: kernels/cuda/kernel_profile.h) the ten
# slowest ops, the time outside them and all GEMMs together, so the next
# optimisation is chosen from a measurement.
bench() {  # label, args...
  local label=$1
  shift
  local j
  j=$(timeout $(cap 400) "$bd"/kvshift bench --json --device "$dev" "$@" 2>"$out/bench_err.log")
  if [ -z "$j" ]; then
    row "$label" "FAILED: $(tail -1 "$out/bench_err.log")"
    return
  fi
  echo "$j" >>"$out/bench.jsonl"
  if ! python3 - "$label" "$j" <<'PY' 2>>"$out/bench_err.log" | tee -a "$summary"; then
import json, sys
label, j = sys.argv[1], json.loads(sys.argv[2])
runs = j if isinstance(j, list) else [j]
if "profile" in runs[0]:
    r = runs[-1]  # with --compare-shift: the KV-shifting run
    ops = [o for o in r["profile"] if not o["op"].startswith(("other", "="))]
    rest = [o for o in r["profile"] if o["op"].startswith(("other", "="))]
    print("%s: %.1f ms/step, the 10 slowest of %d ops (ms/step, share, calls/step, GFLOP/s):" % (
        label, r["median_ms_per_step"], len(ops)))
    for o in ops[:10] + rest:
        print("  %-52s %9.3f %6.1f%% %6.0f %9.1f" % (o["op"], o["ms_per_step"], 100 * o["share"], o["calls_per_step"],
                                                    o["gflops"]))
    if "profile_extra_over_vanilla" in r:  # where KV shifting's extra time goes (bench computes it)
        d = r["profile_extra_over_vanilla"]
        print("%s: KV shifting's extra %.2f ms/step, the 10 largest per op (ms/step, calls/step with, without):" % (
            label, sum(o["ms_per_step"] for o in d)))
        for o in d[:10]:
            print("  %-52s %+9.3f %6.0f %6.0f" % (o["op"], o["ms_per_step"], o["calls_per_step"],
                                                 o["calls_per_step_without"]))
    sys.exit(0)
# Two runs: --compare-shift (vanilla, kvshift), --compare-overlap (AdamW after the step, overlapped) or
# --compare-gemm-timing (cuBLASLt's first algorithms, the timed fastest).
timing = len(runs) == 2 and runs[0].get("time_gemm_algorithms") != runs[1].get("time_gemm_algorithms")
overlap = len(runs) == 2 and runs[0]["kv_shift"] == runs[1]["kv_shift"] and not timing
for r in runs:
    what = ("GEMMs timed" if r["time_gemm_algorithms"] else "GEMMs cuBLASLt's first") if timing else (
        ("AdamW overlapped" if r["overlap_optimizer"] else "AdamW after") if overlap else (
            "kvshift" if r["kv_shift"] else "vanilla"))
    print("%-44s %8.0f tok/s  %6.1f TFLOP/s  MFU %4.1f%%  %7.0f MiB  %.1f ms/step" % (
        "%s %s" % (label, what), r["tokens_per_s"], r["model_tflops_per_s"], 100 * r.get("mfu", 0),
        r["peak_rss_mib"], r["median_ms_per_step"]))
ms = [r["median_ms_per_step"] for r in runs]
if timing:
    if runs[1].get("gemm_timing"):
        print("  " + runs[1]["gemm_timing"])
    print("%-44s %.3fx" % (label + " timed GEMM speed-up", ms[0] / ms[1]))
elif overlap:
    print("%-44s %.3fx" % (label + " overlap speed-up", ms[0] / ms[1]))
elif len(runs) == 2:
    print("%-44s %+.1f%%" % (label + " shift overhead", 100 * (ms[1] / ms[0] - 1)))
PY
    row "$label" "FAILED: bench printed JSON this script cannot read (bench.jsonl, bench_err.log)"
  fi
}

if [ $build_rc -eq 0 ]; then
  if want bench; then
    # The host rehearsal checks these rows' format, not their figures: fewer steps on the CPU engine.
    toy_steps=(--warmup 3 --steps 10) toy_profile_steps=(--warmup 2 --steps 3)
    [ "$dev" = cpu ] && toy_steps=(--warmup 1 --steps 2) toy_profile_steps=(--warmup 1 --steps 1)
    bench "toy lm-small (8x256)" --compare-shift --config configs/toy/lm-small-kvshift.json "${toy_steps[@]}"
    bench "toy lm-small (8x256) per-op profile" --profile --compare-shift --config configs/toy/lm-small-kvshift.json \
      "${toy_profile_steps[@]}"
    if [ $quick -eq 0 ]; then
      bench "paper 1.5B (4x2048)" --compare-shift --config configs/paper/1.5B-kvshift.json \
        --set train.micro_batch_size=4 --set train.grad_accum_steps=1 --warmup 2 --steps 5
      # cuBLASLt's first algorithm for every GEMM against the fastest of its candidates
      # (train.time_gemm_algorithms: chosen after the first warm-up step).
      bench "paper 1.5B (4x2048)" --compare-gemm-timing --config configs/paper/1.5B-kvshift.json \
        --set train.micro_batch_size=4 --set train.grad_accum_steps=1 --warmup 2 --steps 5
      # Both configs profiled, so the ops that make KV shifting's overhead are named (target: <= 1%).
      bench "paper 1.5B (4x2048) per-op profile" --profile --compare-shift --config configs/paper/1.5B-kvshift.json \
        --set train.micro_batch_size=4 --set train.grad_accum_steps=1 --warmup 2 --steps 3
      # AdamW after the step against AdamW overlapping the next forward (train.overlap_optimizer, the default;
      # 1.005x on the H200, 2026-11-29).
      bench "paper 1.5B (4x2048)" --compare-overlap --config configs/paper/1.5B-kvshift.json \
        --set train.micro_batch_size=4 --set train.grad_accum_steps=1 --warmup 2 --steps 5
      # The same on the mma.sync attention kernels (train.attention_backend "flash-mma"; the rows above run
      # "flash": the Hopper kernels on a 9.0 GPU with an sm_90a build): the Hopper kernels' gain per step.
      bench "paper 1.5B (4x2048) flash-mma" --compare-shift --config configs/paper/1.5B-kvshift.json \
        --set train.micro_batch_size=4 --set train.grad_accum_steps=1 --set train.attention_backend=flash-mma \
        --warmup 2 --steps 5
    fi
  fi
  if want attention; then
    echo "attention microbenchmark (ours beside cuDNN SDPA, same shapes, same run; then shift+RoPE vs copy):" |
      tee -a "$summary"
    attn_args=(--batch 4 --heads 16 --kv-heads 16 --head-dim 128 --seq-len 1024 --seq-len 2048)
    [ $quick -eq 1 ] || attn_args+=(--seq-len 4096 --seq-len 8192)
    attn_bin="$bd"/kvshift gemm_host_args=()
    if [ "$dev" = cpu ] && [ -x "$bd"/kvshift_host ]; then
      # The host rehearsal: the CUDA kernels through their launchers on the host
      # shim (times read 0), tiny shapes, so the tables and their rows are checked.
      attn_bin="$bd"/kvshift_host
      attn_args=(--batch 1 --heads 2 --kv-heads 1 --head-dim 16 --seq-len 64 --seq-len 130 --reps 1 --doc-len 32)
      # bench-gemm at a toy size: the 1.5B GEMMs would take minutes on the host GEMM.
      gemm_host_args=(--set model.hidden_size=64 --set model.num_attention_heads=4 --set model.num_key_value_heads=4
        --set model.intermediate_size=128 --set model.num_hidden_layers=1
        --set model.vocab_size=256 --set train.micro_batch_size=1 --set train.seq_len=32
        --set model.max_position_embeddings=32 --algos 2 --reps 1)
    fi
    timeout $(cap 300) "$attn_bin" bench-attention "${attn_args[@]}" >"$out/bench_attention.log" 2>&1
    sed 's/^/  /' "$out/bench_attention.log" | tee -a "$summary"
    # One row per sequence length: ours/cuDNN fwd+bwd throughput (the target: >= 0.8).
    awk -F'|' '/^ours\/cuDNN fwd\+bwd =/ {exit}
      $1 ~ /^ *[0-9]+ *$/ {gsub(/^ +| +$/, "", $1); gsub(/^ +| +$/, "", $4);
        printf "%-44s  %s\n", "attention T=" $1 " ours/cuDNN fwd+bwd", $4}' "$out/bench_attention.log" | tee -a "$summary"
    # And against cuDNN's deterministic backward (ours is deterministic): the last number of the row.
    awk -F'|' '/^ours\/cuDNN fwd\+bwd =/ {exit}
      $1 ~ /^ *[0-9]+ *$/ && NF >= 5 {gsub(/^ +| +$/, "", $1); v = $5; gsub(/^ +| +$/, "", v);
        if (v ~ /n\/a/) v = "n/a"; else {n = split(v, w, / +/); v = w[n]}
        printf "%-44s  %s\n", "attention T=" $1 " ours/cuDNN-det fwd+bwd", v}' "$out/bench_attention.log" |
      tee -a "$summary"
    # And our kernels' default tile loads (cp.async + ldmatrix) against the first version's.
    awk -F'|' '/^our mma.sync kernels, tile loads/ {on = 1; next} on && /^ *$/ {exit}
      on && $1 ~ /^ *[0-9]+ *$/ {gsub(/^ +| +$/, "", $1); gsub(/^ +| +$/, "", $4);
        printf "%-44s  %s\n", "attention T=" $1 " cp.async/sync speed fwd, bwd", $4}' "$out/bench_attention.log" |
      tee -a "$summary"
    # And the Hopper kernels (wgmma) against the default ones (mma.sync).
    awk -F'|' '/^our flash attention: Hopper kernels/ {on = 1; next} on && /^ *$/ {exit}
      on && $1 ~ /^ *[0-9]+ *$/ {gsub(/^ +| +$/, "", $1); gsub(/^ +| +$/, "", $4);
        printf "%-44s  %s\n", "attention T=" $1 " wgmma/mma.sync speed fwd, bwd", $4}' "$out/bench_attention.log" |
      tee -a "$summary"
    # And the Hopper kernels with 2 and 3 warpgroups per block (forward; 2 in the backward) against "flash" (1).
    for wg in 2 3; do
      awk -F'|' -v wg=$wg '$0 ~ "^our Hopper kernels: " wg " warpgroups" {on = 1; next} on && /^ *$/ {exit}
        on && $1 ~ /^ *[0-9]+ *$/ {gsub(/^ +| +$/, "", $1); gsub(/^ +| +$/, "", $4);
          printf "%-44s  %s\n", "attention T=" $1 " wg" wg "/wg1 speed fwd, bwd", $4}' "$out/bench_attention.log" |
        tee -a "$summary"
    done
    # And packed documents (document masks, their tiles skipped) against causal over the whole sequence.
    awk -F'|' '/^our flash attention with document masks/ {on = 1; next} on && /^ *$/ {exit}
      on && $1 ~ /^ *[0-9]+ *$/ {gsub(/^ +| +$/, "", $1); gsub(/^ +| +$/, "", $4);
        printf "%-44s  %s\n", "attention T=" $1 " docs/causal speed fwd, bwd", $4}' "$out/bench_attention.log" |
      tee -a "$summary"
    # And shift+RoPE: forward and backward GB/s over the copy's, per kernel variant (the target: >= 0.9).
    awk -F'|' '/^KV shift \+ RoPE/ {on = 1; next} on && /^ *$/ {exit}
      on && $1 ~ /^ *[0-9]+ *$/ {gsub(/^ +| +$/, "", $1); r = "";
        for (i = 4; i <= 7; ++i) {x = $i; gsub(/^ +| +$/, "", x); gsub(/ +/, " ", x); r = r (i > 4 ? ", " : "") x}
        printf "%-44s  %s\n", "shift+RoPE T=" $1 " f b/copy: 8w, 4w, 8w rows, 4w rows", r}' \
      "$out/bench_attention.log" | tee -a "$summary"
    # The 1.5B step's GEMMs with each of cuBLASLt's first 8 heuristic algorithms: is the first one (the engine's)
    # the fastest? One row: a micro-batch's GEMMs with the first against with the best (the table in its log).
    timeout $(cap 120) "$attn_bin" bench-gemm --config configs/paper/1.5B-kvshift.json \
      --set train.micro_batch_size=4 --set train.seq_len=2048 ${gemm_host_args[@]+"${gemm_host_args[@]}"} \
      >"$out/bench_gemm.log" 2>&1
    sed 's/^/  /' "$out/bench_gemm.log" | tee -a "$summary"
    sed -n 's/^a micro-batch.s GEMMs .*: \([0-9.]*x\)$/\1/p' "$out/bench_gemm.log" |
      awk '{printf "%-44s  %s\n", "1.5B GEMMs: heuristic first / best algorithm", $1}' | tee -a "$summary"
  fi
  want launch && launch_rows
  want dp && { dp_rows; cudnn_rows; }
  want pp && pp_rows
  if want hf; then
    # The HF export loaded by this machine's own transformers (whatever python3 has it), not .venv-hf.
    # With the dp section's reference run (trained on the GPU), that checkpoint too:
    # exported, and its logits and greedy tokens equal to the CPU engine's.
    given=()
    [ -f "$out/dp1/checkpoints/latest" ] && given=(--checkpoint "$out/dp1")
    KVS_HF_NO_VENV=1 timeout $(cap 300) python3 tests/hf/run_hf.py --kvshift "$bd"/kvshift --workdir "$out/hf" \
      "${given[@]}" >"$out/hf.log" 2>&1
    stack=$(head -1 "$out/hf.log" | grep -oE '(transformers|torch) [^ ,]+' | paste -sd' ' -)
    row "HF export (${stack:-$(head -1 "$out/hf.log" | cut -c1-40)})" "$(grep -E '^[0-9]+ passed' "$out/hf.log" | tail -1 || echo "see $out/hf.log")"
    if [ ${#given[@]} -gt 0 ]; then
      row "HF export of the $dev-trained dp=1 run" "$(grep -cE '^given .*PASS$' "$out/hf.log") of 2 checks passed"
    fi
  fi
  if want ctest; then
    # Everything else (CPU tests, python tests); the Cuda* tests ran above.
    (cd "$bd" && timeout "$(cap "${KVS_CTEST_TIMEOUT:-480}")" ctest -j"$(nproc)" -E '^Cuda' --timeout $(cap 400) >"$out/ctest.log" 2>&1)
    row "ctest (all but Cuda*)" "$(grep -E 'tests passed' "$out/ctest.log" || echo "see $out/ctest.log")"
  fi
fi
row "wall time" "$(($(date +%s) - t0)) s"
[ "$(date +%s)" -ge "$deadline" ] && row "budget" "used up (KVS_CHECK_BUDGET=${KVS_CHECK_BUDGET:-560} s): the last sections were cut short"
echo "MFU = model FLOPs/s (6*N_nonembedding + 6*N_lm_head + 6*L*T*d_head*n_heads per token) / peak dense bf16"
echo "logs: $out"
