#!/usr/bin/python3
"""How the CPU engine's throughput grows with threads and model size, and how it depends on the
OpenBLAS kernels: `kvshift bench` for every (config, thread count, OpenBLAS core), interleaved
over --rounds, medians printed as a Markdown table with tokens/s, model TFLOP/s and the
fraction of the fp32 SGEMM peak calibrated on the same threads and kernels.

  /usr/bin/python3 scripts/bench_cpu_scaling.py --rounds 3 \\
      --config configs/toy/lm-small-kvshift.json --config configs/toy/lm-4x-kvshift.json
  /usr/bin/python3 scripts/bench_cpu_scaling.py --rounds 3 --threads 1 --threads 2 \\
      --config configs/toy/lm-small-kvshift.json --core default --core Cooperlake --core SkylakeX \\
      --core Haswell --core Zen

Thread counts default to 1, 2, 4, ... up to and including every core (os.cpu_count()). A core
is run with OPENBLAS_CORETYPE set to it; "default" unsets OPENBLAS_CORETYPE (and
OPENBLAS_L2_SIZE), so kvshift picks the kernels itself. Without --core the environment is
passed as it is.
"""
import argparse
import json
import os
import subprocess
import sys


def bench(binary, config, threads, warmup, steps, recalibrate, core=None):
    cmd = [binary, "bench", "--config", config, "--device", "cpu", "--json", "--warmup", str(warmup),
           "--steps", str(steps), "--set", f"train.threads={threads}"]
    if recalibrate:
        cmd.append("--recalibrate")
    env = dict(os.environ)
    if core == "default":
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    elif core:
        env["OPENBLAS_CORETYPE"] = core
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def default_threads():
    n, out = os.cpu_count() or 1, []
    t = 1
    while t < n:
        out.append(t)
        t *= 2
    return out + [n]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", action="append", required=True, help="kvshift config (repeatable)")
    p.add_argument("--threads", type=int, action="append", help="thread count (repeatable; default 1, 2, 4, .. all)")
    p.add_argument("--core", action="append",
                   help="OpenBLAS core to run with (repeatable; 'default': kvshift's own choice)")
    p.add_argument("--kvshift", default=os.path.join("build", "kvshift"))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--rounds", type=int, default=1, help="repeat every run this many times, interleaved")
    p.add_argument("--recalibrate", action="store_true", help="measure the SGEMM peaks again in the first round")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    threads = args.threads or default_threads()
    cores = args.core or [None]
    runs = {(c, t, k): [] for c in args.config for t in threads for k in cores}
    for rnd in range(args.rounds):
        for c, t, k in runs:
            r = bench(args.kvshift, c, t, args.warmup, args.steps, args.recalibrate and rnd == 0, k)
            runs[(c, t, k)].append(r)
            print(f"round {rnd + 1}: {c} {t} threads {r['openblas_core']}: {r['tokens_per_s']:,.0f} tokens/s, "
                  f"load {r['loadavg_1min']:.2f}", file=sys.stderr)
    rows = []
    for (c, t, k), rs in runs.items():
        rows.append({"config": c, "threads": t, "core_asked": k or "environment",
                     "tokens_per_s": median([r["tokens_per_s"] for r in rs]),
                     "cpu_ms_per_step": median([r["median_cpu_ms_per_step"] for r in rs]),
                     "model_tflops_per_s": median([r["model_tflops_per_s"] for r in rs]),
                     "fraction_of_sgemm_peak": median([r["fraction_of_sgemm_peak"] for r in rs]),
                     "sgemm_peak_gflops": median([r["sgemm_peak_gflops"] for r in rs]),
                     "openblas_core": rs[-1]["openblas_core"],
                     "openblas_core_source": rs[-1].get("openblas_core_source", ""),
                     "loadavg": [r["loadavg_1min"] for r in rs]})
    if args.json:
        print(json.dumps(rows))
        return 0
    print("| config | threads | OpenBLAS kernels | tokens/s | CPU ms/step | model TFLOP/s | SGEMM peak GFLOP/s "
          "| of peak | load avg |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {os.path.basename(r['config'])} | {r['threads']} | {r['openblas_core']} "
              f"({r['openblas_core_source']}) | {r['tokens_per_s']:,.0f} | {r['cpu_ms_per_step']:.0f} | "
              f"{r['model_tflops_per_s']:.3f} | {r['sgemm_peak_gflops']:.0f} | "
              f"{100 * r['fraction_of_sgemm_peak']:.0f}% | {min(r['loadavg']):.1f}-{max(r['loadavg']):.1f} |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        sys.exit(f"error: {e}")
