#!/usr/bin/python3
"""How the CPU engine's throughput grows with threads and model size, and how it depends on the
GEMM kernels: `kvshift bench` for every (config, thread count, GEMM kernels), interleaved
over --rounds, medians printed as a Markdown table with tokens/s, model TFLOP/s and the
fraction of the machine's fp32 SGEMM peak calibrated on the same threads.

  /usr/bin/python3 scripts/bench_cpu_scaling.py --rounds 3 \\
      --config configs/toy/lm-small-kvshift.json --config configs/toy/lm-4x-kvshift.json
  /usr/bin/python3 scripts/bench_cpu_scaling.py --rounds 3 --threads 1 --threads 2 \\
      --config configs/toy/lm-small-kvshift.json --core default --core onednn --core Cooperlake \\
      --core SkylakeX --core Haswell --core Zen
  /usr/bin/python3 scripts/bench_cpu_scaling.py --rounds 12 --threads 2 --core default \\
      --config configs/toy/lm-small-kvshift.json --kvshift /tmp/kvshift-before --kvshift build/kvshift

Thread counts default to 1, 2, 4, ... up to and including every core (os.cpu_count()). An
OpenBLAS core is run with KVS_CPU_GEMM=openblas and OPENBLAS_CORETYPE set to it; "onednn" with
KVS_CPU_GEMM=onednn; "default" unsets KVS_CPU_GEMM, KVS_CPU_GEMM_THREADS, KVS_CPU_REPLICAS,
OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE), so kvshift picks the library, its threading, the thread
replicas and the kernels itself. Without --core the environment is passed as it is. The GEMM
column says ", split" where the products were split into one tile per thread
(KVS_CPU_GEMM_THREADS) and ", N thread replicas" where each thread ran its share of the
sequences (KVS_CPU_REPLICAS).

With two or more --kvshift binaries (a change against the commit before it), every run is
done with each binary in turn, and the table is followed by each binary's median step time
against the first's: the median of the per-round ratios and their range, which is how far a
noisy machine can be trusted (a shared VM's rounds spread by 10-30%).
"""
import argparse
import json
import os
import subprocess
import sys


def bench(binary, config, threads, warmup, steps, recalibrate, core=None, sets=()):
    cmd = [binary, "bench", "--config", config, "--device", "cpu", "--json", "--warmup", str(warmup),
           "--steps", str(steps), "--set", f"train.threads={threads}"]
    for s in sets:
        cmd += ["--set", s]
    if recalibrate:
        cmd.append("--recalibrate")
    env = dict(os.environ)
    if core == "default":
        for name in ("KVS_CPU_GEMM", "KVS_CPU_GEMM_THREADS", "KVS_CPU_REPLICAS", "OPENBLAS_CORETYPE",
                     "OPENBLAS_L2_SIZE"):
            env.pop(name, None)
    elif core and core.lower() == "onednn":
        env["KVS_CPU_GEMM"] = "onednn"
    elif core:
        env["KVS_CPU_GEMM"] = "openblas"
        env["OPENBLAS_CORETYPE"] = core
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def gemms(r):
    """The GEMMs' library and kernels, from `bench --json` ("OpenBLAS SkylakeX", "oneDNN 2.6.3"),
    ", split" when their threads split each product, and the thread replicas."""
    lib = r.get("gemm_library") or f"OpenBLAS {r.get('openblas_core')}"
    replicas = r.get("cpu_replicas", 1)
    return (lib + (", split" if r.get("gemm_threading") == "split" else "")
            + (f", {replicas} thread replicas" if replicas > 1 else ""))


def gemm_source(r):
    """Why those: the library's reason, and for OpenBLAS where its kernel family came from."""
    src = r.get("gemm_library_source") or ""
    if gemms(r).startswith("OpenBLAS"):
        src = (src + "; " if src else "") + "kernels " + r.get("openblas_core_source", "")
    return src


def median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def default_threads():
    n, out = os.cpu_count() or 1, []
    t = 1
    while t < n:
        out.append(t)
        t *= 2
    return out + [n]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--config", action="append", required=True, help="kvshift config (repeatable)")
    p.add_argument("--threads", type=int, action="append", help="thread count (repeatable; default 1, 2, 4, .. all)")
    p.add_argument("--core", action="append",
                   help="GEMM kernels to run with (repeatable): an OpenBLAS core, 'onednn', or 'default' "
                        "(kvshift's own choice)")
    p.add_argument("--kvshift", action="append",
                   help="kvshift binary (repeatable: binaries compared run by run; default build/kvshift)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override passed to every run (repeatable), e.g. train.seq_len=1024")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--rounds", type=int, default=1, help="repeat every run this many times, interleaved")
    p.add_argument("--recalibrate", action="store_true", help="measure the SGEMM peaks again in the first round")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds: must be at least 1, got %d" % args.rounds)
    if args.threads and min(args.threads) < 1:
        p.error("--threads: must be at least 1, got %d" % min(args.threads))
    threads = args.threads or default_threads()
    cores = args.core or [None]
    binaries = args.kvshift or [os.path.join("build", "kvshift")]
    if len(set(binaries)) != len(binaries):
        raise ValueError("--kvshift: the same binary twice")
    runs = {(c, t, k, b): [] for c in args.config for t in threads for k in cores for b in binaries}
    for rnd in range(args.rounds):
        for c, t, k, b in runs:
            r = bench(b, c, t, args.warmup, args.steps, args.recalibrate and rnd == 0 and b == binaries[0], k,
                      args.set)
            runs[(c, t, k, b)].append(r)
            who = f" {b}" if len(binaries) > 1 else ""
            print(f"round {rnd + 1}: {c} {t} threads {gemms(r)}{who}: {r['tokens_per_s']:,.0f} tokens/s, "
                  f"{r['median_ms_per_step']:.1f} ms/step, load {r['loadavg_1min']:.2f}"
                  + (f", CPU steal {100 * r['cpu_steal_fraction']:.1f}%" if r.get("cpu_steal_fraction") is not None
                     else ""), file=sys.stderr)
    rows = []
    for (c, t, k, b), rs in runs.items():
        rows.append({"config": c, "threads": t, "core_asked": k or "environment", "kvshift": b,
                     "median_ms_per_step": median([r["median_ms_per_step"] for r in rs]),
                     "tokens_per_s": median([r["tokens_per_s"] for r in rs]),
                     "cpu_ms_per_step": median([r["median_cpu_ms_per_step"] for r in rs]),
                     "model_tflops_per_s": median([r["model_tflops_per_s"] for r in rs]),
                     "fraction_of_sgemm_peak": median([r["fraction_of_sgemm_peak"] for r in rs]),
                     "sgemm_peak_gflops": median([r["sgemm_peak_gflops"] for r in rs]),
                     "gemm_kernels": gemms(rs[-1]),
                     "gemm_source": gemm_source(rs[-1]),
                     "loadavg": [r["loadavg_1min"] for r in rs]})
    # Each binary against the first, round by round (the rounds interleave them).
    comparisons = []
    for (c, t, k, b), rs in runs.items():
        if b == binaries[0]:
            continue
        base = runs[(c, t, k, binaries[0])]
        ratios = sorted(x["median_ms_per_step"] / y["median_ms_per_step"] for x, y in zip(base, rs))
        comparisons.append({"config": c, "threads": t, "core_asked": k or "environment", "kvshift": b,
                            "baseline": binaries[0], "speedup_median": median(ratios),
                            "speedup_min": ratios[0], "speedup_max": ratios[-1], "rounds": len(ratios)})
    if args.json:
        print(json.dumps({"runs": rows, "comparisons": comparisons} if comparisons else rows))
        return 0
    binary_col = len(binaries) > 1
    print("| config | threads |" + (" kvshift |" if binary_col else "") +
          " GEMM kernels | tokens/s | CPU ms/step | model TFLOP/s | SGEMM peak GFLOP/s | of peak | load avg |")
    print("|---|---|" + ("---|" if binary_col else "") + "---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {os.path.basename(r['config'])} | {r['threads']} |" + (f" {r['kvshift']} |" if binary_col else "") +
              f" {r['gemm_kernels']} ({r['gemm_source']}) | {r['tokens_per_s']:,.0f} | {r['cpu_ms_per_step']:.0f} | "
              f"{r['model_tflops_per_s']:.3f} | {r['sgemm_peak_gflops']:.0f} | "
              f"{100 * r['fraction_of_sgemm_peak']:.0f}% | {min(r['loadavg']):.1f}-{max(r['loadavg']):.1f} |")
    for cmp in comparisons:
        print(f"{os.path.basename(cmp['config'])}, {cmp['threads']} threads, {cmp['core_asked']}: {cmp['kvshift']} is "
              f"{cmp['speedup_median']:.3f}x {cmp['baseline']} (median of {cmp['rounds']} per-round ratios of the "
              f"median step; range {cmp['speedup_min']:.3f}-{cmp['speedup_max']:.3f})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        sys.exit(f"error: {e}")
