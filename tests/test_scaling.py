#!/usr/bin/python3
"""Test of scripts/scaling.py (docs/scaling.md) against hand-computed numbers.

    /usr/bin/python3 tests/test_scaling.py --kvshift build/kvshift

Where the tool and `kvshift info --json` model the same thing they must agree:
parameter counts and FLOPs per token (the C++ formulas), the CUDA engine's
activation plan at cp 1 without SP (memory_bytes_cuda, to the byte), and what
sequence and context parallelism change in one rank's activations (the CPU
engine's plan, activations_per_rank). Its per-GPU bytes must equal the ring
formulas worked out here by hand for the paper's 19B config on 240 GPUs, and
SP's collectives, the CP ring and halo, the dp x cp gradient reduction, the
memory and the fit decision for 19B at 32k tokens on 256 GPUs (the worked
example of docs/scaling.md); bad layouts must be one-line errors. Prints
`N passed, N failed`; exit 1 on any failure. Registered in CTest as
`scaling_tool`.
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

    check_cuda_plan(a.kvshift)
    check_sequence_parallel(a.kvshift)
    check_context_parallel(a.kvshift)
    check_layout_search()

    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


def info(kvshift, cfg, *sets):
    """kvshift info --json for cfg with --set overrides (device cpu, so that cp > 1 is accepted)."""
    args = [kvshift, "info", "--config", cfg, "--json", "--set", "device=cpu"]
    for s in sets:
        args += ["--set", s]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def search_row(j, dp, cp, tp, sp):
    return next(x for x in j["rows"] if (x["dp"], x["cp"], x["tp"], x["sp"]) == (dp, cp, tp, sp))


# The 19B model (configs/paper/19B-kvshift.json): L = 48, C = 6144, F = 16384, 48 query heads and 4 KV
# heads of 128, vocabulary 48000, KV shift of K and V with window 1.
L19, C19, D19 = 48, 6144, 128


def params_19b_tp4():
    """TP rank 0's parameters at tp 4, by hand: per layer 2 norms, q and o (1536 x 6144), k and v
    (128 x 6144), the k/v shift rows (1 KV head x 2), gate/up/down (4096 x 6144); the vocabulary padded
    to 48128 (a multiple of 128 x 4), 12032 rows of the embedding and the LM head; the final norm."""
    layer = 2 * C19 + C19 * (1536 + 128 + 128 + 1536 + 3 * 4096) + 2 * 2
    return L19 * layer + 2 * 12032 * C19 + C19


def check_cuda_plan(kvshift):
    """The activation memory at cp 1 without SP is the CUDA engine's plan (CudaPlan::build), which
    kvshift info reports as memory_bytes_cuda: equal to the byte, as are the parameter bytes and, with
    the fp32 master replicated, the optimizer state ZeRO-1 shards."""
    for name in ("1.5B-kvshift.json", "2.9B-vanilla.json", "19B-kvshift.json"):
        cfg = os.path.join(PAPER, name)
        for rc in ("none", "attention", "full"):
            # micro-batch 2 x 1000 tokens: rows that are no multiple of the 256-byte alignment.
            j = tool_json("--config", cfg, "--gpus", "4", "--micro-batch", "2", "--global-batch", "8",
                          "--seq-len", "1000", "--recompute", rc, "--master", "replicated")
            for x in j["rows"]:
                if x["mode"] != "zero1":
                    continue
                tp = x["tp"]
                mem = info(kvshift, cfg, "parallel.tp=%d" % tp, "train.recompute=" + rc, "train.micro_batch_size=2",
                           "train.seq_len=1000")["memory_bytes_cuda"]
                what = "%s tp %d recompute %s" % (name, tp, rc)
                if mem is None:
                    print("skip  %s: kvshift built without CUDA (no memory_bytes_cuda)" % what)
                    continue
                got = x["activation_bytes"]["total"]
                want = mem["activations_and_workspaces"]
                check(got == want, "%s: activations + workspaces = kvshift info's CUDA plan" % what,
                      "%d vs %d" % (got, want))
                check(10 * x["params_per_gpu"] == mem["weights_and_grads"],
                      "%s: fp32 master + fp32 grads + bf16 copy = 10 B x params_per_gpu" % what)
                check(close(x["state_bytes"], mem["weights_and_grads"] + mem["optimizer_unsharded"] / x["dp"]),
                      "%s: replicated master, ZeRO-1 over dp %d: the moments / dp" % (what, x["dp"]))
    j = tool_json("--config", os.path.join(PAPER, "19B-kvshift.json"), "--gpus", "4", "--tp", "4", "--global-batch", "1")
    check(row(j, 4, "zero1")["params_per_gpu"] == params_19b_tp4() == 4753791168,
          "19B tp 4: 4,753,791,168 parameters per GPU by hand")


def sp_split_counts(N, tp, L, C):
    """What SP changes in one rank's activations, by buffer (both engines' plans): the residual stream
    (layer inputs (L+1), res_mid, ln1, ln2 (L each), lnf, dresid, dln: (4L+4) x C values per row, and
    rstd1, rstd2 (L each), rstdf: 2L+1 fp32 values per row) keeps N/tp of its N rows; two [N, C]
    buffers for the gathered rows and the norm gains' gradients [2L+1, C] are added.
    Returns (rows saved x values, added [N, C] values, added norm-gradient values): (bf16, fp32) pairs."""
    saved = N - N // tp
    return (saved * (4 * L + 4) * C, saved * (2 * L + 1)), 2 * N * C, (2 * L + 1) * C


def check_sequence_parallel(kvshift):
    """SP on 19B at tp 4 (micro-batch 1 x 12288): the saving by hand, in the CPU engine's plan
    (kvshift info's activations_per_rank, fp32) and in the tool's CUDA plan (bf16 values, fp32 rstd
    and norm gradients); the same buffers in both."""
    cfg = os.path.join(PAPER, "19B-kvshift.json")
    for cp in (1, 2):
        N = 12288 // cp
        (rows_bf16, rows_f32), gathered, norm_grads = sp_split_counts(N, 4, L19, C19)
        acts = info(kvshift, cfg, "parallel.tp=4", "parallel.cp=%d" % cp)["activations_per_rank"]
        check(acts["tp"] == 4 and acts["cp"] == cp, "kvshift info: activations_per_rank at tp 4, cp %d" % cp)
        cpu_saved = (acts["without_sequence_parallel"] - acts["with_sequence_parallel"]) / 4
        check(cpu_saved == rows_bf16 + rows_f32 - gathered - norm_grads,
              "cp %d: kvshift info's SP saving = (N - N/4) rows x ((4L+4) C + 2L+1) - 2 N C - (2L+1) C floats" % cp,
              "%d vs %d" % (cpu_saved, rows_bf16 + rows_f32 - gathered - norm_grads))
        j = tool_json("--config", cfg, "--gpus", str(4 * cp), "--tp", "4", "--cp", str(cp), "--global-batch", "1",
                      "--seq-len", "12288")
        off, on = search_row(j, 1, cp, 4, False), search_row(j, 1, cp, 4, True)
        want = 2 * rows_bf16 + 4 * rows_f32 - 2 * gathered - 4 * norm_grads
        got = off["activation_bytes"]["total"] - on["activation_bytes"]["total"]
        check(got == want, "cp %d: the tool's SP saving = the same buffers in bf16 (rstd, norm grads fp32): %.2f GiB"
              % (cp, want / 2**30), "%d vs %d" % (got, want))
        check(on["activation_bytes"]["residual_stream"] * 4 == off["activation_bytes"]["residual_stream"] and
              on["activation_bytes"]["per_token"] == off["activation_bytes"]["per_token"],
              "cp %d: SP divides the residual stream by tp and nothing else" % cp)
    # Communication: per micro-batch 6L + 3 all-gathers and 4L + 2 reduce-scatters instead of 4L + 2
    # all-reduces (the bytes: check_layout_search).
    check(on["tp_collectives_per_micro_batch"] == {"all_gather": 6 * 48 + 3, "reduce_scatter": 4 * 48 + 2} and
          off["tp_collectives_per_micro_batch"] == {"all_reduce": 4 * 48 + 2},
          "SP: 291 all-gathers + 194 reduce-scatters per micro-batch (the backward gathers the inputs again)")


def check_context_parallel(kvshift):
    """CP on 19B at tp 4 (micro-batch 1 x 12288): every per-token buffer of both plans divides by cp;
    the CPU plan's fp32 T x T attention probabilities (which the CUDA engine's flash attention does not
    keep) are taken out by hand. The ring's own buffers by hand."""
    cfg = os.path.join(PAPER, "19B-kvshift.json")
    T, Hq, Hkv = 12288, 12, 1

    def cpu_per_row(floats, cp):
        Tc = T // (2 * cp)
        att = (L19 * T * T + T * T) * Hq if cp == 1 else (L19 * cp * 4 * Tc * Tc + Tc * Tc) * Hq
        coef = (Hq + 2 * Hkv) * 2  # [Hq | Hkv | Hkv] x (W+1)
        fixed = T * D19 + L19 * coef + (coef + 15) // 16 * 16  # RoPE tables, coefficients, their gradient
        return floats / 4 - att - fixed
    cpu = [cpu_per_row(info(kvshift, cfg, "parallel.tp=4", "parallel.cp=%d" % cp)["activations_per_rank"]
                       ["without_sequence_parallel"], cp) for cp in (1, 2)]
    check(cpu[0] == 2 * cpu[1], "kvshift info: CP 2 halves the CPU plan's per-token floats", "%d vs %d" % tuple(cpu))
    tool_rows = [search_row(tool_json("--config", cfg, "--gpus", str(4 * cp), "--tp", "4", "--cp", str(cp), "--sp", "off",
                                      "--global-batch", "1", "--seq-len", str(T)), 1, cp, 4, False)
                 for cp in (1, 2)]
    per_token = [x["activation_bytes"]["residual_stream"] + x["activation_bytes"]["per_token"] for x in tool_rows]
    check(per_token[0] == 2 * per_token[1], "the tool: CP 2 halves the per-token activations (%.2f -> %.2f GiB)"
          % (per_token[0] / 2**30, per_token[1] / 2**30))
    # The ring at cp 2 (N = 6144 rows, K/V 128 wide each): the block in hand and the next, K/V bf16 +
    # dK/dV fp32; the merged output / dq fp32 [N, 1536]; one block's lse [12 heads, 6144]; the halo:
    # 1 row per chunk, 2 chunks, of k and v (256 values) from each of 2 ranks, and its gradient, bf16.
    N = 6144
    want = 2 * N * 2 * 128 * 6 + N * 1536 * 4 + Hq * N * 4 + 2 * 2 * 2 * 1 * 256 * 2
    check(tool_rows[1]["activation_bytes"]["cp_ring"] == want and tool_rows[0]["activation_bytes"]["cp_ring"] == 0,
          "cp 2: the ring's buffers, %d bytes by hand" % want, str(tool_rows[1]["activation_bytes"]["cp_ring"]))


def check_layout_search():
    """The worked example of docs/scaling.md: 19B, 256 GPUs, 96 x 32768 tokens per step, by hand."""
    cfg = os.path.join(PAPER, "19B-kvshift.json")
    base = ("--config", cfg, "--gpus", "256", "--seq-len", "32768", "--global-batch", "96")
    j = tool_json(*base, "--cp", "all")
    P = params_19b_tp4()
    gbs, nvlink, ib = 0.45 * 989e12, 900e9, 50e9
    attn_fwd = 2 * 32768 ** 2 * D19 * 48  # causal attention forward FLOPs of one sequence, every head

    # dp 32 x cp 2 x tp 4 with SP: 3 micro-batches per GPU, each GPU holds 16384 rows of each.
    sp, nosp = search_row(j, 32, 2, 4, True), search_row(j, 32, 2, 4, False)
    S = 16384 * C19 * 2  # one [rows, C] bf16 buffer: 201 MB
    check(sp["micro_batches_per_gpu"] == 3 and sp["tp_collectives_per_layer"] == {"all_gather": 6, "reduce_scatter": 4}
          and close(sp["tp_bytes_per_gpu"], 3 * (291 + 194) * 3 / 4 * S) and sp["tp_link"] == "nvlink"
          and close(sp["tp_comm_s"], sp["tp_bytes_per_gpu"] / nvlink),
          "dp 32 x cp 2 x tp 4 SP: TP 3 x 485 x 3/4 x 201 MB = %.2f GB on NVLink" % (3 * 485 * 0.75 * S / 1e9),
          str(sp["tp_bytes_per_gpu"]))
    check(close(nosp["tp_bytes_per_gpu"], 3 * 194 * 2 * 3 / 4 * S) and
          close(sp["tp_bytes_per_gpu"] / nosp["tp_bytes_per_gpu"], 485 / 388),
          "without SP: 194 all-reduces; SP sends 5/4 of it")
    ring = 1 * 16384 * 256 * 2 + 2 * 16384 * 256 * 6  # forward: 1 step of K/V bf16; backward: 2 with dK/dV fp32
    halo = 2 * (2 * 1 * 256 * 2)  # forward and backward all-gather over 2 ranks: 1 row x 2 chunks x (k, v)
    check(sp["cp_ring_bytes_per_layer"] == ring and sp["cp_halo_bytes_per_layer"] == halo and sp["cp_link"] == "nvlink"
          and close(sp["cp_bytes_per_gpu"], 3 * 48 * (ring + halo)),
          "dp 32 x cp 2 x tp 4: ring %.1f MB + halo %d B per layer, cp x tp = 8 GPUs: one node" % (ring / 1e6, halo))
    check(sp["grad_group"] == 64 and close(sp["dp_reduce_bytes_per_gpu"], 63 / 64 * 4 * P) and
          close(sp["dp_gather_bytes_per_gpu"], 63 / 64 * 2 * P) and sp["dp_link"] == "ib",
          "ZeRO-1 over dp x cp = 64: reduce-scatter 63/64 x 4 P, all-gather 63/64 x 2 P over InfiniBand")
    check(all(close(x["step_s"], x["compute_s"] + x["tp_comm_s"] + x["cp_comm_s"] + x["dp_comm_s"]) and
              close(x["efficiency"], x["compute_s"] / x["step_s"]) and x["step_overlap_s"] <= x["step_s"]
              for x in j["rows"]), "every layout: step = compute + TP + CP + DP; overlap never slower")

    # Memory: the same state (6 B + 12 B / 64 per parameter), SP saves the residual stream's 3/4.
    (rows_bf16, rows_f32), gathered, norm_grads = sp_split_counts(16384, 4, L19, C19)
    saved = 2 * rows_bf16 + 4 * rows_f32 - 2 * gathered - 4 * norm_grads
    check(close(sp["state_bytes"], 6 * P + 12 * P / 64) and close(nosp["state_bytes"], sp["state_bytes"]),
          "state: bf16 params + fp32 grads + (fp32 master + moments) / 64")
    check(close((nosp["memory_gib"] - sp["memory_gib"]) * 2**30, saved) and not nosp["fits"] and sp["fits"],
          "fit: dp 32 x cp 2 x tp 4 needs %.1f GiB (no), with SP %.1f GiB (yes): SP saves %.2f GiB"
          % (nosp["memory_gib"], sp["memory_gib"], saved / 2**30))
    check(all(x["fits"] == (x["memory_gib"] <= 80) and
              close(x["memory_gib"] * 2**30, x["state_bytes"] + x["activation_bytes"]["total"]) for x in j["rows"]),
          "fits = state + activations <= 80 GiB, for every layout")
    j60 = tool_json(*base, "--cp", "all", "--gpu-mem-gib", "60")
    check(not search_row(j60, 32, 2, 4, True)["fits"] and search_row(j60, 16, 4, 4, True)["fits"],
          "--gpu-mem-gib 60: dp 32 x cp 2 x tp 4 SP no longer fits, dp 16 x cp 4 x tp 4 SP does")

    # dp 16 x cp 4 x tp 4: the ring spans two nodes (InfiniBand) and hides behind the attention: a
    # forward step sends 8192 rows x 256 x 2 B while computing 1/16 of the rank's causal attention.
    r4 = search_row(j, 16, 4, 4, False)
    step_fwd = 8192 * 256 * 2
    ratio = (step_fwd / ib) / (attn_fwd / (4 * 16) / gbs)
    check(r4["cp_link"] == "ib" and close(r4["cp_ring_over_attention_forward"], ratio) and r4["cp_ring_hides"]
          and close(r4["cp_comm_exposed_overlap_s"], 6 * 48 * r4["cp_halo_bytes_per_layer"] / ib),
          "dp 16 x cp 4 x tp 4: ring over InfiniBand at %.2f of the attention time: hidden (only the halo shows)" % ratio)
    # dp 4 x cp 16 x tp 4: 2048 rows per GPU; the backward's step (K/V + fp32 dK/dV) outlasts its attention.
    r16 = search_row(j, 4, 16, 4, False)
    f_comm, b_comm = 2048 * 256 * 2 / ib, 2048 * 256 * 6 / ib
    f_attn = attn_fwd / (4 * 16 * 16) / gbs
    exposed = 24 * 48 * (15 * max(0, f_comm - f_attn) + 16 * max(0, b_comm - 2 * f_attn) +
                         r16["cp_halo_bytes_per_layer"] / ib)
    check(not r16["cp_ring_hides"] and r16["cp_ring_over_attention_backward"] > 1 and
          close(r16["cp_comm_exposed_overlap_s"], exposed),
          "dp 4 x cp 16 x tp 4: the backward ring is exposed: %.3f s per step" % exposed)

    check(j["recommended"] == {"layout": "dp 16 x cp 4 x tp 4", "mode": "zero1"} and
          j["recommended_without_overlap"] == {"layout": "dp 32 x cp 2 x tp 4 SP", "mode": "zero1"},
          "19B at 32k on 256 GPUs: dp 16 x cp 4 x tp 4 fastest, dp 32 x cp 2 x tp 4 SP without overlap",
          "%s / %s" % (j["recommended"], j["recommended_without_overlap"]))
    # The paper's 19B run (12288 tokens) on the engines as they are: dp 60 x tp 4 fits only with full recomputation.
    jp = [row(tool_json("--config", cfg, "--gpus", "240", "--tp", "4", "--master", "replicated", "--recompute", rc), 4,
              "zero1") for rc in ("none", "full")]
    check(not jp[0]["fits"] and abs(jp[0]["memory_gib"] - 92.4) < 0.05 and jp[1]["fits"],
          "19B on 240 GPUs, fp32 master on every GPU: dp 60 x tp 4 needs %.1f GiB, %.1f with full recomputation"
          % (jp[0]["memory_gib"], jp[1]["memory_gib"]))
    jr = tool_json(*base, "--cp", "all", "--master", "replicated")
    check(close(search_row(jr, 16, 4, 4, False)["state_bytes"], 10 * P + 8 * P / 64) and
          not search_row(jr, 32, 2, 4, True)["fits"] and jr["recommended"]["layout"] == "dp 16 x cp 4 x tp 4",
          "fp32 master on every GPU (kvshift today): 10 B + 8 B / 64 per parameter; dp 32 x cp 2 x tp 4 SP no longer fits")

    # The table lists the layouts that fit (--all: every one), fastest first; errors are one line.
    r = tool(*base, "--cp", "all")
    lines = r.stdout.splitlines()
    check(r.returncode == 0 and any(x.startswith("dp 32 x cp 2 x tp 4 SP ") for x in lines) and
          not any(x.startswith("dp 32 x cp 2 x tp 4  ") for x in lines) and
          "fastest layout that fits: dp 16 x cp 4 x tp 4" in r.stdout, "layout table: only what fits", r.stdout)
    r = tool(*base, "--cp", "all", "--all")
    check(any(x.startswith("dp 32 x cp 2 x tp 4  ") and x.endswith(" !") for x in r.stdout.splitlines()),
          "--all: the layouts over the memory too, marked !")
    for args, part in ((["--gpus", "240", "--cp", "3"], "--cp 3: seq_len 32768 is not divisible by 2 x cp = 6"),
                       (["--cp", "two"], "--cp must be a positive integer or 'all'"),
                       (["--sp", "on", "--tp", "1"], "--sp on needs tp > 1"),
                       (["--cp", "4", "--global-batch", "7"], "no layout of 256 GPUs splits the global batch of 7")):
        r = tool(*(base + tuple(args)))
        err = r.stderr.strip()
        check(r.returncode == 1 and err.startswith("scaling: error:") and part in err and "\n" not in err,
              "error: %s" % part, err)


if __name__ == "__main__":
    sys.exit(main())
