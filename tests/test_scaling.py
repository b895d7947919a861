#!/usr/bin/python3
"""Test of scripts/scaling.py (docs/scaling.md) against hand-computed numbers.

    /usr/bin/python3 tests/test_scaling.py --kvshift build/kvshift

Its parameter count and FLOPs per token must equal `kvshift info --json` (the
C++ formulas), its per-GPU bytes must equal the ring formulas worked out here
by hand for the paper's 19B config on 240 GPUs, and bad layouts must be
one-line errors. Prints `N passed, N failed`; exit 1 on any failure.
Registered in CTest as `scaling_tool`.
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "scripts", "scaling.py")
PAPER = os.path.join(ROOT, "configs", "paper")
PY = sys.executable or "/usr/bin/python3"

passed, failed = 0, 0


def check(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print("ok    %s" % what)
    else:
        failed += 1
        print("FAIL  %s%s" % (what, (": " + detail) if detail else ""))


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b))


def tool(*args):
    return subprocess.run([PY, TOOL] + list(args), capture_output=True, text=True)


def tool_json(*args):
    r = tool(*args, "--json")
    if r.returncode != 0:
        raise SystemExit("scaling.py %s failed: %s" % (" ".join(args), r.stderr))
    return json.loads(r.stdout)


def row(j, tp, mode):
    return next(x for x in j["rows"] if x["tp"] == tp and x["mode"] == mode)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kvshift", required=True)
    a = p.parse_args()

    # The tool's model arithmetic is the C++ one, for every paper config.
    for f in sorted(os.listdir(PAPER)):
        cfg = os.path.join(PAPER, f)
        info = json.loads(subprocess.run([a.kvshift, "info", "--config", cfg, "--json"], capture_output=True,
                                         text=True, check=True).stdout)
        j = tool_json("--config", cfg, "--gpus", "8", "--global-batch", "8", "--micro-batch", "1")
        for k in ("params_total", "params_non_embedding", "params_shift", "train_flops_per_token"):
            check(close(j[k], info[k]), "%s: %s equals kvshift info" % (f, k), "%s vs %s" % (j[k], info[k]))

    # 19B on 240 GPUs, by hand (P = every parameter, shift scalars included).
    cfg19 = os.path.join(PAPER, "19B-kvshift.json")
    j = tool_json("--config", cfg19, "--gpus", "240")
    P = 19011803136 + 768  # kvshift info: params_total + params_shift
    check(j["params_total"] + j["params_shift"] == P, "19B: 19,011,803,904 parameters")
    dp1 = row(j, 1, "dp")
    # Plain DP, fp32 gradients, ring all-reduce over 240 ranks: 2 * 239/240 * 4 bytes * P.
    check(close(dp1["dp_bytes_per_gpu"], 2 * 239 / 240 * 4 * P), "19B dp 240: ring all-reduce bytes = 2(n-1)/n x 4P",
          str(dp1["dp_bytes_per_gpu"]))
    check(abs(dp1["dp_bytes_per_gpu"] / 1e9 - 151.46) < 0.01, "19B dp 240: 151.46 GB sent per GPU per step")
    check(dp1["dp_link"] == "ib" and close(dp1["dp_comm_s"], dp1["dp_bytes_per_gpu"] / 50e9),
          "19B dp 240: across nodes at 400 Gb/s = 50 GB/s")
    z1 = row(j, 1, "zero1")
    # ZeRO-1: reduce-scatter fp32 gradients + all-gather bf16 parameters, (n-1)/n each.
    check(close(z1["dp_bytes_per_gpu"], 239 / 240 * (4 + 2) * P), "19B dp 240 ZeRO-1: (n-1)/n x (4 + 2) P")
    # Compute: 134,044,618,752 FLOP/token x 240 x 12288 tokens over 240 GPUs at 45% of 989 TFLOP/s.
    want = 134044618752 * 240 * 12288 / (240 * 0.45 * 989e12)
    check(close(dp1["compute_s"], want), "19B: compute %.3f s per step at 45%% MFU" % want, str(dp1["compute_s"]))
    # Full recomputation adds one forward of every layer: 2 N_nonembedding + 2 L T h FLOPs per token.
    jr = tool_json("--config", cfg19, "--gpus", "240", "--tp", "1", "--recompute", "full")
    want = (134044618752 + 2 * 18421979136 + 2 * 48 * 12288 * 6144) * 240 * 12288 / (240 * 0.45 * 989e12)
    check(close(row(jr, 1, "dp")["compute_s"], want), "19B full recompute: compute %.3f s" % want)
    # TP 4: per micro-batch (4 per layer x 48 + 2) all-reduces of [1, 12288, 6144] bf16 over 4 ranks, and each
    # GPU runs 240 / 60 = 4 micro-batches per step.
    tp4 = row(j, 4, "zero1")
    want = 4 * (4 * 48 + 2) * 2 * 3 / 4 * (12288 * 6144 * 2)
    check(tp4["micro_batches_per_gpu"] == 4 and close(tp4["tp_bytes_per_gpu"], want),
          "19B dp 60 x tp 4: TP bytes %.2f GB per GPU" % (want / 1e9), str(tp4["tp_bytes_per_gpu"]))
    check(tp4["tp_link"] == "nvlink" and close(tp4["tp_comm_s"], want / 900e9), "19B tp 4: on NVLink at 900 GB/s")
    check(not any(x["tp"] == 8 for x in j["rows"]), "19B: tp 8 is not offered (4 KV heads)")
    check(j["recommended"] is not None and j["recommended"]["layout"] == "dp 60 x tp 4",
          "19B on 240 GPUs: dp 60 x tp 4 recommended", str(j["recommended"]))
    # Efficiency is compute over step; with overlap the step is never longer.
    check(all(close(x["efficiency"], x["compute_s"] / x["step_s"]) and x["step_overlap_s"] <= x["step_s"]
              for x in j["rows"]), "efficiency = compute / step; overlap never slower")
    # bf16 gradients halve the all-reduce.
    jb = tool_json("--config", cfg19, "--gpus", "240", "--tp", "1", "--grad-dtype", "bf16")
    check(close(row(jb, 1, "dp")["dp_bytes_per_gpu"], dp1["dp_bytes_per_gpu"] / 2), "bf16 gradients: half the bytes")
    # One node: the DP group stays on NVLink.
    jn = tool_json("--config", cfg19, "--gpus", "8", "--tp", "1", "--global-batch", "8")
    check(row(jn, 1, "dp")["dp_link"] == "nvlink", "8 GPUs: DP on NVLink")

    # The table prints; errors are one line.
    r = tool("--config", os.path.join(PAPER, "2.9B-kvshift.json"), "--gpus", "512")
    check(r.returncode == 0 and "dp 256 x tp 2" in r.stdout and "fastest layout that fits" in r.stdout,
          "2.9B on 512 GPUs: table printed", r.stdout + r.stderr)
    for args, part in ((["--gpus", "240", "--tp", "8"], "tp 8 does not divide num_key_value_heads (4)"),
                       (["--gpus", "250", "--tp", "4"], "--tp 4 does not divide --gpus 250"),
                       (["--gpus", "256", "--tp", "1"], "not a multiple of dp x micro-batch")):
        r = tool("--config", cfg19, *args)
        err = r.stderr.strip()
        check(r.returncode == 1 and err.startswith("scaling: error:") and part in err and "\n" not in err,
              "error: %s" % part, err)

    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
