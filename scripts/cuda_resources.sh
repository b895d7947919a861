#!/usr/bin/env bash
# Registers, spills, stack and static shared memory of every CUDA kernel, as
# ptxas reports them (-Xptxas -v), for one architecture: a host-side look at
# occupancy limits and local-memory spills before a GPU sees the code
# (docs/CUDA.md "Kernel resources"). Each .cu file is compiled with the
# build's own command (compile_commands.json of a -DKVS_CUDA=ON build), its
# architectures replaced by the one asked for.
# With --ptx it also counts, per kernel of the flash attention files, the PTX
# instructions that move data and do the math (shared loads, ldmatrix,
# cp.async, global loads, shared stores, mma.sync, barriers; loops are
# unrolled, so a count is per block of the loop body): the host-side view of
# what the tile-load paths (kernels/cuda/ops.h FlashLoads) change.
# It also lists ptxas's notes on wgmma (sm_90a): C7518, "wgmma.mma_async
# instructions are serialized" (every wgmma then waits for the one before:
# no overlap with the softmax, no pipelining), and C7519, a warpgroup.arrive
# the compiler injected; and exits 1 if there is any. --files SUBSTRING
# compiles only the files whose name contains it (ctest `cuda_wgmma_async`:
# --files _sm90 90a).
#   bash scripts/cuda_resources.sh [--ptx] [--files SUBSTRING] [arch, default 90] [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
ptx=0 files=""
while [ $# -gt 0 ]; do
  case $1 in
    --ptx) ptx=1; shift ;;
    --files) files=$2; shift 2 ;;
    *) break ;;
  esac
done
exec /usr/bin/python3 - "${1:-90}" "${2:-build}" "$ptx" "$files" <<'PY'
import collections, json, os, re, shlex, subprocess, sys, tempfile

arch, build, want_ptx, only = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
db = os.path.join(build, "compile_commands.json")
try:
    entries = [e for e in json.load(open(db)) if e["file"].endswith(".cu") and only in os.path.basename(e["file"])]
except FileNotFoundError:
    sys.exit(f"cuda_resources: {db} not found: configure {build} with -DKVS_CUDA=ON first")
if not entries:
    sys.exit(f"cuda_resources: no .cu file{' named *' + only + '*' if only else ''} in {db}: "
             f"configure {build} with -DKVS_CUDA=ON")
notes = []  # (file, kernel, ptxas's wgmma note)
print(f"{'file':22} {'kernel':44} {'regs':>5} {'spill_B':>7} {'stack_B':>7} {'smem_B':>6}")
with tempfile.TemporaryDirectory() as tmp:
    for e in sorted(entries, key=lambda e: e["file"]):
        args = shlex.split(e["command"])
        args = [a for a in args if not a.startswith("--generate-code")]
        args[args.index("-o") + 1] = os.path.join(tmp, "k.o")
        args += [f"--generate-code=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v"]
        r = subprocess.run(args, cwd=e["directory"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"cuda_resources: {e['file']} did not compile:\n{r.stderr[-2000:]}")
        f, kernel, stack, spill = os.path.basename(e["file"]), "", 0, 0
        for line in (r.stdout + r.stderr).splitlines():
            m = re.search(r"Compiling entry function '([^']+)'", line)
            if m:
                kernel = m.group(1)
                continue
            m = re.search(r"\((C751[89])\) (.*?) in function '([^']+)'", line)
            if m:
                notes.append((f, m.group(3), m.group(1) + " " + m.group(2)))
                continue
            m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)
            if m:
                stack, spill = int(m.group(1)), int(m.group(2))
                continue
            m = re.search(r"Used (\d+) registers", line)
            if m:
                smem = re.search(r"(\d+) bytes smem", line)
                name = subprocess.run(["c++filt", "-p", kernel], capture_output=True, text=True).stdout.strip()
                name = name.replace("kvs::cuda::(anonymous namespace)::", "").replace("kvs::cuda::", "")
                print(f"{f:22} {name[:44]:44} {int(m.group(1)):5} {spill:7} {stack:7} "
                      f"{int(smem.group(1)) if smem else 0:6}")
def demangled(k):
    name = subprocess.run(["c++filt", "-p", k], capture_output=True, text=True).stdout.strip()
    return name.replace("kvs::cuda::(anonymous namespace)::", "").replace("kvs::cuda::", "")
if notes:
    print(f"\nptxas notes on wgmma (sm_{arch}): the kernels' wgmmas are not asynchronous as written")
    for f, k, note in notes:
        print(f"{f:22} {demangled(k)[:44]:44} {note}")
elif arch.startswith("90"):
    print(f"\nptxas notes on wgmma (sm_{arch}): none (no wgmma serialized, no warpgroup.arrive injected)")
if want_ptx:
    ops = ["ld.shared", "ldmatrix", "cp.async.cg", "ld.global", "st.shared", "mma.sync", "bar.sync"]
    print(f"\nPTX instructions per kernel (sm_{arch}):")
    print(f"{'kernel':44} " + " ".join(f"{o:>11}" for o in ops) + f" {'all':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for e in sorted(entries, key=lambda e: e["file"]):
            if "flash_attention" not in e["file"]:
                continue
            args = [a for a in shlex.split(e["command"]) if not a.startswith("--generate-code") and a != "-c"]
            out = os.path.join(tmp, "k.ptx")
            args[args.index("-o") + 1] = out
            args += [f"--generate-code=arch=compute_{arch},code=compute_{arch}", "-ptx"]
            r = subprocess.run(args, cwd=e["directory"], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"cuda_resources: {e['file']} did not compile to PTX:\n{r.stderr[-2000:]}")
            for body in re.split(r"\n\.visible \.entry ", open(out).read())[1:]:
                mangled = body.split("(")[0]
                count = collections.Counter()
                for line in body.splitlines():
                    words = line.split()
                    if not words or words[0].startswith(("//", ".", "{", "}", "$")):
                        continue
                    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
                    count["all"] += 1
                    for o in ops:
                        count[o] += op.startswith(o)
                name = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
                name = re.sub(r"\(.*", "", name.replace("kvs::cuda::", ""))
                print(f"{name[:44]:44} " + " ".join(f"{count[o]:11}" for o in ops) + f" {count['all']:6}")
sys.exit(1 if notes else 0)
PY
