#!/usr/bin/python3
"""How the CPU engine's throughput grows with threads and model size: `kvshift bench` for every
(config, thread count), interleaved over --rounds, medians printed as a Markdown table with
tokens/s, model TFLOP/s and the fraction of the fp32 SGEMM peak calibrated on the same threads.

  /usr/bin/python3 scripts/bench_cpu_scaling.py --rounds 3 \\
      --config configs/toy/lm-small-kvshift.json --config configs/toy/lm-4x-kvshift.json

Thread counts default to 1, 2, 4, ... up to and including every core (os.cpu_count()).
"""
import argparse
import json
import os
import subprocess
import sys


def bench(binary, config, threads, warmup, steps, recalibrate):
    cmd = [binary, "bench", "--config", config, "--device", "cpu", "--json", "--warmup", str(warmup),
           "--steps", str(steps), "--set", f"train.threads={threads}"]
    if recalibrate:
        cmd.append("--recalibrate")
    proc = subprocess.run(cmd, capture_output=True, text=True)
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
    p.add_argument("--kvshift", default=os.path.join("build", "kvshift"))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--rounds", type=int, default=1, help="repeat every run this many times, interleaved")
    p.add_argument("--recalibrate", action="store_true", help="measure the SGEMM peaks again in the first round")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    threads = args.threads or default_threads()
    runs = {(c, t): [] for c in args.config for t in threads}
    for rnd in range(args.rounds):
        for c in args.config:
            for t in threads:
                r = bench(args.kvshift, c, t, args.warmup, args.steps, args.recalibrate and rnd == 0)
                runs[(c, t)].append(r)
                print(f"round {rnd + 1}: {c} {t} threads: {r['tokens_per_s']:,.0f} tokens/s, "
                      f"load {r['loadavg_1min']:.2f}", file=sys.stderr)
    rows = []
    for (c, t), rs in runs.items():
        rows.append({"config": c, "threads": t, "tokens_per_s": median([r["tokens_per_s"] for r in rs]),
                     "model_tflops_per_s": median([r["model_tflops_per_s"] for r in rs]),
                     "fraction_of_sgemm_peak": median([r["fraction_of_sgemm_peak"] for r in rs]),
                     "sgemm_peak_gflops": median([r["sgemm_peak_gflops"] for r in rs]),
                     "openblas_core": rs[-1]["openblas_core"],
                     "loadavg": [r["loadavg_1min"] for r in rs]})
    if args.json:
        print(json.dumps(rows))
        return 0
    print("| config | threads | tokens/s | model TFLOP/s | SGEMM peak GFLOP/s | of peak | OpenBLAS | load avg |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {os.path.basename(r['config'])} | {r['threads']} | {r['tokens_per_s']:,.0f} | "
              f"{r['model_tflops_per_s']:.3f} | {r['sgemm_peak_gflops']:.0f} | "
              f"{100 * r['fraction_of_sgemm_peak']:.0f}% | {r['openblas_core']} | "
              f"{min(r['loadavg']):.1f}-{max(r['loadavg']):.1f} |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        sys.exit(f"error: {e}")
