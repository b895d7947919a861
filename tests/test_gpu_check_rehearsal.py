#!/usr/bin/python3
"""A rehearsal of scripts/gpu_check.sh on a host without a GPU (CTest `gpu_check_rehearsal`):

    /usr/bin/python3 tests/test_gpu_check_rehearsal.py --build BUILD --workdir DIR

A lent GPU machine gives a session 15 minutes, so the script that spends them must not be
debugged on it. This runs its sections with the host's build (KVS_CHECK_BUILD), every training
run and benchmark on the CPU engine (KVS_CHECK_DEVICE=cpu) and fewer steps, a stand-in
compute-sanitizer that runs the tests it is given, and python3 from .venv-hf5 (current torch and
transformers, as on the GPU image) when present. Then it checks the summary row by row: the
flags the script passes, the JSON and log lines it parses, the launchers (torchrun or its
variables, mpirun), the loss-curve comparisons, the sanitizer's test filters (each names tests
that exist), bench-attention's tables (run by kvshift_host, the kernels on the host shim),
the HF export of the run the script trained, and the logs bundled into $OUT.
What it cannot show: anything on the GPU itself (the NCCL rows fail here with a one-line reason).
Prints `N passed, N failed`; exit 1 on any failure.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile

from checks import Tally  # tests/checks.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")

TALLY = Tally(quiet=True)
check = TALLY.check

# Runs what it is given after its own options, and logs the tool and the test filter.
FAKE_SANITIZER = r'''#!/bin/bash
tool=""
while [ $# -gt 0 ]; do
  case $1 in
    --tool) tool=$2; shift 2 ;;
    --error-exitcode|--print-limit) shift 2 ;;
    --*) shift ;;
    *) break ;;
  esac
done
echo "$tool $*" >>"$FAKE_SANITIZER_LOG"
exec "$@"
'''


def rows(summary):
    """label -> value of the summary table: the label, two spaces at least, the value."""
    out = {}
    for line in open(summary):
        parts = re.split(r" {2,}", line.strip(), maxsplit=1)
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def find(table, prefix):
    hits = [v for k, v in table.items() if k.startswith(prefix)]
    return hits[0] if hits else None


def loss_diff_ok(value):
    """A curve_diff row: N logged losses, max rel diff X vs one process. The CPU engine's ranks
    agree with one process to rounding."""
    m = re.match(r"(\d+) logged losses, max rel diff ([0-9.e+-]+) vs one process, final loss ([0-9.]+)$", value or "")
    return bool(m) and int(m.group(1)) >= 1 and float(m.group(2)) < 1e-6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="a build directory with kvshift and kvshift_tests")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    work = os.path.abspath(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    logs, out, bindir = (os.path.join(work, d) for d in ("logs", "out", "bin"))
    os.makedirs(bindir)
    sanitizer = os.path.join(bindir, "compute-sanitizer")
    with open(sanitizer, "w") as f:
        f.write(FAKE_SANITIZER)
    os.chmod(sanitizer, 0o755)

    sections = "cuda,sanitize,bench,attention,launch,dp,pp"
    path = [bindir]
    venv = next((v for v in (".venv-hf5", ".venv-hf") if os.path.exists(os.path.join(ROOT, v, "bin", "python3"))),
                None)
    if venv:
        path.append(os.path.join(ROOT, venv, "bin"))
        sections += ",hf"
    else:
        print("no .venv-hf5 or .venv-hf (scripts/setup.sh): the hf section is not rehearsed")
    env = dict(os.environ, KVS_CHECK_BUILD=os.path.abspath(a.build), KVS_CHECK_DEVICE="cpu",
               KVS_CHECK_STEPS="10", KVS_CHECK_LOGS=logs, OUT=out, FAKE_SANITIZER_LOG=os.path.join(work, "san.log"),
               PATH=os.pathsep.join(path + [os.environ.get("PATH", "")]), OMP_NUM_THREADS="2")
    p = subprocess.run(["bash", SCRIPT, "--quick", "--only", sections], env=env, cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    print(p.stdout)
    check(p.returncode == 0, "gpu_check.sh exits 0", str(p.returncode))
    summary = os.path.join(logs, "summary.txt")
    check(os.path.exists(summary), "summary.txt written")
    if not os.path.exists(summary):
        return TALLY.finish()
    t = rows(summary)
    check(find(t, "GPU") == "none found", "GPU row", find(t, "GPU"))

    # cuda: one process per suite; on a host every test passes or skips (no GPU), none fails.
    listed = subprocess.run([os.path.join(a.build, "kvshift_tests"), "--gtest_list_tests", "--gtest_filter=Cuda*"],
                            stdout=subprocess.PIPE, text=True).stdout
    n_tests = sum(1 for line in listed.splitlines() if line.startswith("  "))
    v = find(t, "CUDA tests (Cuda*)")
    m = re.match(r"(\d+) passed, (\d+) failed, (\d+) skipped", v or "")
    check(bool(m) and int(m.group(2)) == 0 and int(m.group(1)) + int(m.group(3)) == n_tests,
          f"CUDA tests row counts all {n_tests} Cuda* tests, none failed", v)

    # sanitize: three clean rows, and every pattern of every filter names tests that exist.
    for label in ("memcheck: kernels", "memcheck: engine", "racecheck: attention"):
        check(find(t, label) == "clean", f"{label} row", find(t, label))
    san = open(env["FAKE_SANITIZER_LOG"]).read().splitlines() if os.path.exists(env["FAKE_SANITIZER_LOG"]) else []
    check([s.split()[0] for s in san] == ["memcheck", "memcheck", "racecheck"], "sanitizer tools in order", str(san))
    for s in san:
        flt = re.search(r"--gtest_filter=(\S+)", s)
        check(bool(flt), "sanitizer runs kvshift_tests with a filter", s)
        for pat in (flt.group(1).split(":") if flt else []):
            r = subprocess.run([os.path.join(a.build, "kvshift_tests"), "--gtest_list_tests", f"--gtest_filter={pat}"],
                               stdout=subprocess.PIPE, text=True).stdout
            check(any(line.startswith("  ") for line in r.splitlines()), f"sanitizer filter {pat} names tests")

    # bench: the JSON of `bench --compare-shift` parsed into two rows and the overhead.
    for kind in ("vanilla", "kvshift"):
        v = find(t, f"toy lm-small (8x256) {kind}")
        check(bool(re.match(r"\d+ tok/s .* MiB +[0-9.]+ ms/step$", v or "")), f"bench row {kind}", v)
    check(bool(re.match(r"[+-]\d+\.\d%$", find(t, "toy lm-small (8x256) shift overhead") or "")), "shift overhead row")
    # bench --profile: the ten slowest ops, then the time outside them and all GEMMs together.
    lines = open(summary).read().splitlines()
    head = [i for i, line in enumerate(lines)
            if line.startswith("toy lm-small (8x256) per-op profile: ") and "the 10 slowest" in line]
    check(len(head) == 1 and re.search(r"ms/step, the 10 slowest of \d+ ops", lines[head[0]]), "profile header",
          str([lines[i] for i in head]))
    if head:
        body = lines[head[0] + 1:head[0] + 13]
        check(len(body) == 12 and all(re.match(r"  \S.* +-?[0-9.]+ +-?[0-9.]+% +\d+ +[0-9.]+$", b) for b in body),
              "profile: 10 ops, other and all GEMMs", "\n".join(body))
        check(any(b.startswith("  = all GEMMs") for b in body) and any(" proj fwd " in b for b in body),
              "profile names the projections' GEMMs and sums them", "\n".join(body))
        # --compare-shift: then the ops that make KV shifting's extra time, 10 rows.
        extra = lines[head[0] + 13:head[0] + 24]
        check(bool(extra) and re.match(r"toy lm-small \(8x256\) per-op profile: KV shifting's extra -?[0-9.]+ ms/step, "
                                       r"the 10 largest per op", extra[0]) is not None, "profile difference header",
              extra[0] if extra else "")
        check(len(extra) == 11 and all(re.match(r"  \S.* +[+-][0-9.]+ +\d+ +\d+$", b) for b in extra[1:]),
              "profile difference: 10 ops with their calls", "\n".join(extra))

    # attention: bench-attention of the host-built engine (kvshift_host: the kernels on the host
    # shim, times 0, no cuDNN, no Hopper kernels at head_dim 16) at T = 64 and 130, the five tables parsed into rows.
    for T in (64, 130):
        check(find(t, f"attention T={T} ours/cuDNN fwd+bwd") == "n/a", f"attention T={T} ours/cuDNN row",
              find(t, f"attention T={T} ours/cuDNN fwd+bwd"))
        check(find(t, f"attention T={T} ours/cuDNN-det fwd+bwd") == "n/a", f"attention T={T} ours/cuDNN-det row",
              find(t, f"attention T={T} ours/cuDNN-det fwd+bwd"))
        v = find(t, f"attention T={T} cp.async/sync speed fwd, bwd")
        check(bool(re.match(r"\S+ \S+$", v or "")), f"attention T={T} cp.async/sync row (two ratios)", v)
        check(find(t, f"attention T={T} wgmma/mma.sync speed fwd, bwd") == "n/a",
              f"attention T={T} wgmma row (n/a on the host at head_dim 16)",
              find(t, f"attention T={T} wgmma/mma.sync speed fwd, bwd"))
        for wg in (2, 3):
            check(find(t, f"attention T={T} wg{wg}/wg1 speed fwd, bwd") == "n/a",
                  f"attention T={T} wg{wg} row (n/a on the host at head_dim 16)",
                  find(t, f"attention T={T} wg{wg}/wg1 speed fwd, bwd"))
        v = find(t, f"attention T={T} docs/causal speed fwd, bwd")
        check(bool(re.match(r"\S+ \S+$", v or "")), f"attention T={T} document masks row (two ratios)", v)
        v = find(t, f"shift+RoPE T={T} f b/copy")
        check(bool(re.match(r"\S+ \S+(, \S+ \S+){3}$", v or "")),
              f"shift+RoPE T={T} row (four variants' forward and backward ratios)", v)

    # bench-gemm of kvshift_host at a toy size (times 0, one heuristic algorithm on the host): its summary row.
    check(find(t, "1.5B GEMMs: heuristic first / best algorithm") == "1.000x", "bench-gemm row",
          find(t, "1.5B GEMMs: heuristic first / best algorithm"))

    # launch: NCCL needs a GPU (here the run stops at choosing one: any other error, such as a
    # mistyped flag in gpu_check.sh, fails); the training run and its checkpoint on the CPU.
    for label in ("NCCL world of 1", "NCCL 2 ranks"):
        v = find(t, label)
        check(v is not None and (v.startswith("ok") or "NCCL all-reduce" in v
                                 or v.startswith("FAILED: kvshift: error: GPU selection: ")
                                 or v.startswith("refused by NCCL")), f"{label} row", v)
    v = find(t, "train, device cpu, world of 1")
    check(bool(re.match(r"10 steps, val_loss [0-9.]+, accuracy", v or "")), "torchrun train row", v)
    check((find(t, "eval on the CPU of that checkpoint") or "").endswith("rel diff 0.0e+00"),
          "CPU eval of the run's checkpoint equals the run's own", find(t, "eval on the CPU of that checkpoint"))

    # dp and pp: every curve compared with one process.
    for label in ("train cpu, 2 MPI ranks on 1 GPU", "train cpu, tp=2 x dp=1", "train cpu, tp=2 x dp=2",
                  "train cpu, tp=2 + sequence parallel", "train cpu, cp=2", "train cpu, pp=2 1F1B",
                  "train cpu, pp=2 x v2 tied recompute"):
        check(loss_diff_ok(find(t, label)), f"{label} row", find(t, label))
    # train.shard_master off against on (the CPU engine keeps its weights whole either way).
    check(re.match(r"identical: \d+ logged losses and the checkpoint$", find(t, "train cpu, 2 MPI ranks: fp32 master whole "
                                                                          "vs sharded") or "") is not None,
          "whole vs sharded fp32 master row", find(t, "train cpu, 2 MPI ranks: fp32 master whole vs sharded"))
    for label in ("train cpu, NCCL dp=2", "train cpu, NCCL pp=2"):
        check((find(t, label) or "").startswith("not run: needs 2 GPUs"), f"{label} row", find(t, label))
    check((find(t, "train cpu, attention cudnn") or "").startswith("n/a: device cpu"), "cuDNN row")

    if "hf" in sections:
        v = find(t, "HF export (")
        check(bool(re.match(r"\d+ passed, 0 failed$", v or "")), "HF export row", v)
        check(find(t, "HF export of the cpu-trained dp=1 run") == "2 of 2 checks passed", "HF export of the run",
              find(t, "HF export of the cpu-trained dp=1 run"))

    failed_rows = [k for k, v in t.items() if "FAILED" in v and not k.startswith("NCCL")]
    check(not failed_rows, "no other row failed", str(failed_rows))
    check("wall time" in t, "wall time row")

    # $OUT: the summary and the logs, as the device tool brings them back.
    check(os.path.exists(os.path.join(out, "summary.txt")), "summary.txt in $OUT")
    tgz = os.path.join(out, "logs.tar.gz")
    names = tarfile.open(tgz).getnames() if os.path.exists(tgz) else []
    for name in ("./cuda_tests.log", "./dp1.log", "./pp2_mpi.log", "./bench.jsonl", "./memcheck_kernels.log"):
        check(name in names, f"{name} in $OUT/logs.tar.gz")
    return TALLY.finish()


if __name__ == "__main__":
    sys.exit(main())
