#!/usr/bin/python3
"""Test of scripts/scaling.py (docs/scaling.md) against hand-computed numbers.

    /usr/bin/python3 tests/test_scaling.py --kvshift build/kvshift

Where the tool and `kvshift info --json` model the same thing they must agree:
parameter counts and FLOPs per token (the C++ formulas), the CUDA engine's
activation plan (memory_bytes_cuda, to the byte: every layout with and without
SP, CP and pipeline stages, each stage's), and what sequence and context
parallelism change in one rank's activations (the CPU engine's plan,
activations_per_rank; the CUDA plan's SP saving by hand). Its per-GPU bytes must equal the ring
formulas worked out here by hand for the paper's 19B config on 240 GPUs, and
SP's collectives, the CP ring and halo, the dp x cp gradient reduction, the
memory and the fit decision for 19B at 32k tokens on 256 GPUs (the worked
example of docs/scaling.md); bad layouts must be one-line errors. Pipeline
parallelism: the bubble (pp - 1)/(m v) and the p2p formulas against a timeline
of the engine's schedules written again here from the C++, the in-flight
micro-batches against kvshift info's pipeline_stages, the stage shapes
kvshift refuses, per-stage memory summing to the whole model, and the layouts
where pp wins (docs/scaling.md). Latency: NCCL's Ring/Simple model
(src/graph/tuning.cc) worked out by hand for a TP all-reduce in a node, TP 16
across two nodes, the gradient buckets across nodes, a CP ring step and halo,
a pipeline send; the flags, and the 1024-GPU picks of 1.5B and 6.7B. Prints
`N passed, N failed`; exit 1 on any failure. Registered in CTest as
`scaling_tool`.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from fractions import Fraction

from checks import Tally  # tests/checks.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "scripts", "scaling.py")
PAPER = os.path.join(ROOT, "configs", "paper")
PY = sys.executable or "/usr/bin/python3"

TALLY = Tally(quiet=False)
check = TALLY.check

def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b))


def tool(*args):
    return subprocess.run([PY, TOOL] + list(args), capture_output=True, text=True)


# NCCL's Ring/Simple latency (src/graph/tuning.cc, 2.30.7): 8.4 us a collective, 3.4 us a ring step in a node,
# 14 us a step across nodes; an all-reduce of n ranks on N nodes has 2(n-1) steps, 2(N-1) of them across
# nodes (and is multiplied by 1.4 when N > 1), a reduce-scatter or all-gather n-1 and N-1. A send with its
# receive: 8.4 + one step. Worked out by hand below, in seconds.
US = 1e-6


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
    # Across nodes NCCL runs a ring per NIC: with k group members in a node, each sends 1/k of its bytes out
    # through its own 400 Gb/s = 50 GB/s NIC and (k - 1)/k over NVLink (450 GB/s one way) to the next exit.
    # Latency: kvshift reduces in 48 + 2 buckets (each layer, the embedding, the final norm + LM head), each
    # an all-reduce of 240 ranks on 30 nodes: 478 steps, 58 across nodes, x 1.4.
    ar240 = (8.4 + (478 - 58) * 3.4 + 58 * 14.0) * 1.4
    check(abs(ar240 - 3147.76) < 1e-9 and close(dp1["latency_us"]["dp_reduce"], ar240) and dp1["grad_buckets"] == 50,
          "19B dp 240: NCCL's latency of one bucket's all-reduce over 30 nodes: (8.4 + 420 x 3.4 + 58 x 14) x 1.4 "
          "= 3147.76 us, 50 buckets", str(dp1["latency_us"]))
    check(dp1["dp_link"] == "ib" and dp1["dp_nics_per_node"] == 8 and
          close(dp1["dp_comm_s"], dp1["dp_bytes_per_gpu"] / (8 * 50e9) + 50 * ar240 * US),
          "19B dp 240: 8 ranks a node, 8 NICs of 50 GB/s in parallel (NVLink carries 7/8 at 450: not the limit), "
          "+ 50 x 3.15 ms of latency")
    dp4 = row(j, 4, "zero1")
    # ZeRO-1 over 60 ranks, 2 in each of 30 nodes: a reduce-scatter and an all-gather of 59 steps, 29 across.
    rs60 = 8.4 + (59 - 29) * 3.4 + 29 * 14.0
    check(dp4["dp_link"] == "ib" and dp4["dp_nics_per_node"] == 2 and dp4["dp_nodes"] == 30 and
          close(dp4["dp_comm_s"], dp4["dp_bytes_per_gpu"] / (2 * 50e9) + 50 * 2 * rs60 * US),
          "19B dp 60 x tp 4: 2 ranks of each gradient group a node: 2 NICs, 100 GB/s; 50 buckets of a reduce-scatter "
          "and an all-gather, %.1f us each" % rs60)
    # 12 GPUs: 8 in one node, 4 in the next; the node with 4 carries twice the traffic a NIC.
    j12 = tool_json("--config", cfg19, "--gpus", "12", "--tp", "1", "--global-batch", "12")
    check(row(j12, 1, "dp")["dp_nics_per_node"] == 4 and close(row(j12, 1, "dp")["dp_ring_GBps"], 200),
          "12 GPUs, 8 and 4 a node: the node with 4 sets the pace (200 GB/s)")
    jf = tool_json("--config", cfg19, "--gpus", "240", "--tp", "1", "--ib-gbps", "800")
    check(close(row(jf, 1, "dp")["dp_ring_GBps"], 8 * 450 / 7),
          "800 Gb/s NICs: 8 x 100 GB/s out of the node, but 7/8 of the bytes over NVLink: 514 GB/s",
          str(row(jf, 1, "dp")["dp_ring_GBps"]))
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
    # A TP all-reduce within a node: 4 ranks, 6 steps on NVLink, 8.4 + 6 x 3.4 = 28.8 us, 194 per micro-batch.
    check(close(tp4["latency_us"]["tp_all_reduce"], 28.8) and tp4["tp_nodes"] == 1 and
          close(tp4["tp_latency_s"], 4 * 194 * 28.8 * US),
          "19B tp 4: NCCL's latency of a TP all-reduce in a node, 8.4 + 6 x 3.4 = 28.8 us, 4 x 194 per step",
          str(tp4["latency_us"]))
    check(tp4["tp_link"] == "nvlink" and close(tp4["tp_comm_s"], want / 450e9 + 4 * 194 * 28.8 * US),
          "19B tp 4: on NVLink at 450 GB/s (one direction of NVLink 4's 900), + 22.3 ms of latency")
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
                       (["--gpus", "256", "--tp", "1"], "not a multiple of dp x micro-batch"),
                       (["--gpus", "8", "--global-batch", "0"], "--global-batch must be at least 1"),
                       (["--gpus", "8", "--micro-batch", "0"], "--micro-batch must be at least 1")):
        r = tool("--config", cfg19, *args)
        err = r.stderr.strip()
        check(r.returncode == 1 and err.startswith("scaling: error:") and part in err and "\n" not in err,
              "error: %s" % part, err)

    check_cuda_plan(a.kvshift)
    check_cuda_plan_layouts(a.kvshift)
    check_sequence_parallel(a.kvshift)
    check_context_parallel(a.kvshift)
    check_layout_search()
    check_pipeline(a.kvshift)
    check_latency_flags()

    return TALLY.finish()


def info(kvshift, cfg, *sets, processes=None):
    """kvshift info --json for cfg with --set overrides (device cpu, so that cp > 1 is accepted), planned
    for --processes if given."""
    args = [kvshift, "info", "--config", cfg, "--json", "--set", "device=cpu"]
    for s in sets:
        args += ["--set", s]
    if processes is not None:
        args += ["--processes", str(processes)]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def search_row(j, dp, cp, tp, sp):
    return next(x for x in j["rows"] if (x["dp"], x["cp"], x["tp"], x["sp"]) == (dp, cp, tp, sp))


# The 19B model (configs/paper/19B-kvshift.json): L = 48, C = 6144, F = 16384, 48 query heads and 4 KV
# heads of 128, vocabulary 48000, KV shift of K and V with window 1.
L19, C19, D19 = 48, 6144, 128


def params_19b(tp):
    """TP rank 0's parameters, by hand: per layer 2 norms, q and o (48/tp heads of 128 x 6144), k and v
    (4/tp heads), the k/v shift rows (2 coefficients for each of k and v per KV head), gate/up/down
    (16384/tp x 6144); the vocabulary padded to 48128 (a multiple of 128 x tp), 48128/tp rows of the
    embedding and the LM head; the final norm."""
    q, kv, f = 48 // tp * D19, 4 // tp * D19, 16384 // tp
    layer = 2 * C19 + C19 * (2 * q + 2 * kv + 3 * f) + 2 * 2 * (4 // tp)
    return L19 * layer + 2 * 48128 // tp * C19 + C19


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
    check(row(j, 4, "zero1")["params_per_gpu"] == params_19b(4) == 4753791168,
          "19B tp 4: 4,753,791,168 parameters per GPU by hand")


def check_cuda_plan_layouts(kvshift):
    """Every layout the search takes (dp x pp x cp x tp, SP on and off, virtual stages): the
    tool's activations and workspaces per GPU, per pipeline stage, equal the CUDA engine's plan that
    kvshift info reports for that layout (memory_bytes_cuda, its pipeline_stages), to the byte. The
    1.5B config with documents and a shift window of 2 (the halo's rows, the batch's document starts),
    micro-batch 2 x 1000 tokens (no multiple of the 256-byte alignment), on 8 GPUs; 19B at tp 4 on 16
    GPUs, full recompute. kvshift info plans for the same --processes (dp replicas of grad_accum_steps / dp
    micro-batches each) and its total per GPU under ZeRO-1 over dp x cp is the tool's memory (to 12 bytes:
    kvshift's shards round up)."""
    with open(os.path.join(PAPER, "1.5B-kvshift.json")) as f:
        cfg = json.load(f)
    cfg["model"].update({"document_boundaries": "shift", "bos_token_id": 1})
    cfg["model"]["kv_shift"]["window"] = 2
    with tempfile.TemporaryDirectory() as tmp:
        docs = os.path.join(tmp, "1.5B-documents-window2.json")
        with open(docs, "w") as f:
            json.dump(cfg, f)
        for path, gpus, extra, rc in ((docs, 8, [], "attention"),
                                      (os.path.join(PAPER, "19B-kvshift.json"), 16, ["--tp", "4"], "full")):
            j = tool_json("--config", path, "--gpus", str(gpus), "--micro-batch", "2", "--global-batch", "16",
                          "--seq-len", "1000",
                          "--cp", "all", "--sp", "both", "--pp", "all", "--virtual-stages", "all", "--recompute", rc, *extra)
            agree, kinds = [], set()
            for x in j["rows"]:
                mem = info(kvshift, path, "parallel.tp=%d" % x["tp"], "parallel.cp=%d" % x["cp"],
                           "parallel.pp=%d" % x["pp"], "parallel.virtual_stages=%d" % x["v"],
                           "parallel.sequence_parallel=%s" % str(x["sp"]).lower(), "train.recompute=" + rc,
                           "train.micro_batch_size=2", "train.seq_len=1000",
                           "train.grad_accum_steps=%d" % (x["micro_batches_per_gpu"] * x["dp"]),
                           processes=gpus)["memory_bytes_cuda"]
                if mem is None:
                    print("skip  %s: kvshift built without CUDA (no memory_bytes_cuda)" % path)
                    return
                if x["pp"] == 1:
                    pairs = [(x["activation_bytes"]["total"], mem["activations_and_workspaces"])]
                    totals = [(x["memory_gib"] * 2**30, mem["total_per_gpu"])]
                else:
                    pairs = [(st["activation_bytes"]["total"], en["activations_and_workspaces"])
                             for st, en in zip(x["stages"], mem["pipeline_stages"])]
                    pairs.append((len(x["stages"]), len(mem["pipeline_stages"])))
                    totals = [(st["memory_gib"] * 2**30, en["total_per_gpu"])
                              for st, en in zip(x["stages"], mem["pipeline_stages"])]
                ok = all(a == b for a, b in pairs) and all(0 <= b - a <= 12.01 for a, b in totals)
                agree.append(ok)
                kinds.add((x["pp"] > 1, x["v"] > 1, x["cp"] > 1, x["sp"]))
                if not ok:
                    print("      %s: the tool %s, kvshift info %s" % (x["layout"], [a for a, _ in pairs + totals],
                                                                     [int(b) for _, b in pairs + totals]))
            check(all(agree) and len(kinds) == 12,
                  "%s, recompute %s: %d layouts (with and without pp, virtual stages, cp, SP: all 12 kinds), every GPU's activations "
                  "and its total under ZeRO-1 = kvshift info's CUDA plan for --processes %d" % (os.path.basename(path), rc, len(agree), gpus))


def sp_split_counts(N, tp, L, C):
    """What SP changes in one rank's activations, by buffer, in the CPU engine's plan: the residual
    stream (layer inputs (L+1), res_mid, ln1, ln2 (L each), lnf, dresid, dln: (4L+4) x C values per
    row, and rstd1, rstd2 (L each), rstdf: 2L+1 fp32 values per row) keeps N/tp of its N rows; two
    [N, C] buffers for the gathered rows and the norm gains' gradients [2L+1, C] are added.
    Returns (rows saved x values, added [N, C] values, added norm-gradient values): (bf16, fp32) pairs."""
    saved = N - N // tp
    return (saved * (4 * L + 4) * C, saved * (2 * L + 1)), 2 * N * C, (2 * L + 1) * C


def sp_saving_cuda(N, tp, L, C):
    """SP's saving in the CUDA engine's plan (CudaPlan::build), bytes: the same residual stream plus
    the output projections' result (proj), (4L+5) x C bf16 values per row, and 2L+1 fp32 rstd, keep
    N/tp of the N rows; two [N, C] bf16 buffers for the gathered rows and one layer's two norm gains'
    fp32 gradients [2, C] are added."""
    saved = N - N // tp
    return 2 * saved * (4 * L + 5) * C + 4 * saved * (2 * L + 1) - 2 * 2 * N * C - 4 * 2 * C


def check_sequence_parallel(kvshift):
    """SP on 19B at tp 4 (micro-batch 1 x 12288): the saving by hand, in the CPU engine's plan
    (kvshift info's activations_per_rank, fp32) and in the tool's CUDA plan (bf16 values, fp32 rstd
    and norm gradients; the CUDA plan's own projection buffer and one layer's norm gradients)."""
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
        want = sp_saving_cuda(N, 4, L19, C19)
        got = off["activation_bytes"]["total"] - on["activation_bytes"]["total"]
        check(got == want, "cp %d: the tool's SP saving = (N - N/4) rows x ((4L+5) C bf16 + (2L+1) fp32) - 2 N C bf16 "
              "- 2 C fp32: %.2f GiB"
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
        att = L19 * T * T * Hq if cp == 1 else L19 * cp * 4 * Tc * Tc * Hq  # per layer (no gradient scratch of it)
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
    # The ring at cp 2 (N = 6144 rows in two chunks of Tc = 3072, K/V 128 wide each): the block in
    # hand and the next, K/V bf16 + dK/dV fp32; the merged output / dq fp32 [N, 1536]; one chunk's
    # partial output [Tc, 1536] bf16, its lse [12 heads, Tc] and its dK, dV [Tc, 128] bf16; the halo:
    # 1 row per chunk, 2 chunks, of all 1792 q/k/v columns: the rank's tails and both ranks' halos,
    # bf16, and their gradients, fp32.
    N, Tc, QKV = 6144, 3072, 1536 + 2 * 128
    want = (2 * N * 2 * 128 * 6 + N * 1536 * 4 + Tc * 1536 * 2 + Hq * Tc * 4 + 2 * Tc * 128 * 2 +
            (1 + 2) * 2 * QKV * (2 + 4))
    check(tool_rows[1]["activation_bytes"]["cp_ring"] == want and tool_rows[0]["activation_bytes"]["cp_ring"] == 0,
          "cp 2: the ring's buffers, %d bytes by hand" % want, str(tool_rows[1]["activation_bytes"]["cp_ring"]))


def check_layout_search():
    """The worked example of docs/scaling.md: 19B, 256 GPUs, 96 x 32768 tokens per step, by hand."""
    cfg = os.path.join(PAPER, "19B-kvshift.json")
    base = ("--config", cfg, "--gpus", "256", "--seq-len", "32768", "--global-batch", "96")
    j = tool_json(*base, "--cp", "all")
    P = params_19b(4)
    gbs, nvlink, ib = 0.45 * 989e12, 450e9, 50e9
    attn_fwd = 2 * 32768 ** 2 * D19 * 48  # causal attention forward FLOPs of one sequence, every head

    # dp 32 x cp 2 x tp 4 with SP: 3 micro-batches per GPU, each GPU holds 16384 rows of each.
    sp, nosp = search_row(j, 32, 2, 4, True), search_row(j, 32, 2, 4, False)
    S = 16384 * C19 * 2  # one [rows, C] bf16 buffer: 201 MB
    check(sp["micro_batches_per_gpu"] == 3 and sp["tp_collectives_per_layer"] == {"all_gather": 6, "reduce_scatter": 4}
          and close(sp["tp_bytes_per_gpu"], 3 * (291 + 194) * 3 / 4 * S) and sp["tp_link"] == "nvlink"
          and close(sp["tp_comm_s"], sp["tp_bytes_per_gpu"] / nvlink + 3 * (291 + 194) * (8.4 + 3 * 3.4) * US),
          "dp 32 x cp 2 x tp 4 SP: TP 3 x 485 x 3/4 x 201 MB = %.2f GB on NVLink, each 8.4 + 3 x 3.4 us"
          % (3 * 485 * 0.75 * S / 1e9),
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
          close(sp["dp_gather_bytes_per_gpu"], 63 / 64 * 2 * P) and sp["dp_link"] == "ib" and
          sp["dp_nics_per_node"] == 2 and sp["dp_nodes"] == 32 and
          close(sp["dp_comm_s"], 63 / 64 * 6 * P / (2 * ib) + 50 * 2 * (8.4 + 32 * 3.4 + 31 * 14.0) * US),
          "ZeRO-1 over dp x cp = 64: reduce-scatter 63/64 x 4 P, all-gather 63/64 x 2 P over InfiniBand, "
          "2 of the 64 in each of 32 nodes (their 2 NICs); 50 buckets, each 2 x (8.4 + 32 x 3.4 + 31 x 14) us")
    check(all(close(x["step_s"], x["compute_s"] + x["tp_comm_s"] + x["cp_comm_s"] + x["dp_comm_s"]) and
              close(x["efficiency"], x["compute_s"] / x["step_s"]) and x["step_overlap_s"] <= x["step_s"]
              for x in j["rows"]), "every layout: step = compute + TP + CP + DP; overlap never slower")

    # Memory: the same state (6 B + 12 B / 64 per parameter), SP saves the residual stream's 3/4.
    saved = sp_saving_cuda(16384, 4, L19, C19)
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
    # A CP ring step across nodes is a send and a receive: 8.4 + 14 = 22.4 us (forward; the backward's two,
    # the block and its dK/dV, 44.8). The halo: 3 all-gathers a layer over the 4 CP ranks, which span 2 nodes:
    # 3 steps, 1 across, 8.4 + 2 x 3.4 + 14 = 29.2 us.
    r4 = search_row(j, 16, 4, 4, False)
    step_fwd = 8192 * 256 * 2
    ratio = (step_fwd / ib + 22.4 * US) / (attn_fwd / (4 * 16) / gbs)
    ratio_b = (3 * step_fwd / ib + 44.8 * US) / (2 * attn_fwd / (4 * 16) / gbs)
    check(close(r4["latency_us"]["cp_step_forward"], 22.4) and close(r4["latency_us"]["cp_step_backward"], 44.8) and
          close(r4["latency_us"]["cp_halo_all_gather"], 29.2) and r4["cp_nodes"] == 2,
          "dp 16 x cp 4 x tp 4: a ring step across nodes 8.4 + 14 us (backward two), the halo 8.4 + 2 x 3.4 + 14 us",
          str(r4["latency_us"]))
    check(r4["cp_link"] == "ib" and close(r4["cp_ring_over_attention_forward"], ratio) and
          close(r4["cp_ring_over_attention_backward"], ratio_b) and r4["cp_ring_hides"]
          and close(r4["cp_comm_exposed_overlap_s"], 6 * 48 * (r4["cp_halo_bytes_per_layer"] / ib + 3 * 29.2 * US)),
          "dp 16 x cp 4 x tp 4: ring over InfiniBand, latency included, at %.2f / %.2f of the attention time: hidden "
          "(only the halo shows)" % (ratio, ratio_b))
    check(close(r4["cp_latency_s"], 6 * 48 * ((3 + 2 * 4) * 22.4 + 3 * 29.2) * US),
          "dp 16 x cp 4 x tp 4: CP latency 6 micro-batches x 48 layers x (11 sends x 22.4 + 3 halos x 29.2 us)")
    # dp 4 x cp 16 x tp 4: 2048 rows per GPU; the backward's step (K/V + fp32 dK/dV) outlasts its attention.
    r16 = search_row(j, 4, 16, 4, False)
    # The CP group is 64 GPUs, 8 nodes: a halo all-gather over 16 ranks has 15 steps, 7 across nodes.
    f_comm, b_comm = 2048 * 256 * 2 / ib + 22.4 * US, 2048 * 256 * 6 / ib + 44.8 * US
    f_attn = attn_fwd / (4 * 16 * 16) / gbs
    exposed = 24 * 48 * (15 * max(0, f_comm - f_attn) + 16 * max(0, b_comm - 2 * f_attn) +
                         r16["cp_halo_bytes_per_layer"] / ib + 3 * (8.4 + 8 * 3.4 + 7 * 14.0) * US)
    check(not r16["cp_ring_hides"] and r16["cp_ring_over_attention_backward"] > 1 and
          close(r16["cp_comm_exposed_overlap_s"], exposed),
          "dp 4 x cp 16 x tp 4: the backward ring is exposed: %.3f s per step" % exposed)

    # dp 16 x cp 8 x tp 2: a third of tp 4's TP bytes on NVLink; the ring spans two nodes and hides; each
    # gradient group of 128 has 4 ranks a node.
    r8 = search_row(j, 16, 8, 2, False)
    check(r8["cp_link"] == "ib" and r8["cp_ring_hides"] and r8["dp_nics_per_node"] == 4 and
          close(r8["dp_comm_s"], 127 / 128 * 6 * params_19b(2) / (4 * ib) +
                50 * 2 * (8.4 + (127 - 31) * 3.4 + 31 * 14.0) * US) and
          close(r8["tp_comm_s"], 6 * 194 * (2 / 2 * 4096 * C19 * 2 / nvlink + (8.4 + 2 * 3.4) * US)),
          "dp 16 x cp 8 x tp 2: TP 6 x 194 all-reduces of 4096 rows (50 MB) over 2 ranks on NVLink, 15.2 us each; "
          "gradients over 4 NICs a node of 32 nodes")
    check(j["recommended"] == {"layout": "dp 16 x cp 8 x tp 2", "mode": "zero1"} and
          j["recommended_without_overlap"] == {"layout": "dp 32 x cp 2 x tp 4 SP", "mode": "zero1"},
          "19B at 32k on 256 GPUs: dp 16 x cp 8 x tp 2 fastest, dp 32 x cp 2 x tp 4 SP without overlap",
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
          "fastest layout that fits: dp 16 x cp 8 x tp 2" in r.stdout, "layout table: only what fits", r.stdout)
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


# ---- pipeline parallelism ----

def engine_schedule(pp, v, rank, m):
    """pipeline_schedule() of src/parallel/pipeline_schedule.cpp, written again here from the C++ (not
    from the tool): rank's passes ("F"/"B", micro-batch, chunk) in order."""
    ops = []
    if v == 1:
        warm = min(pp - rank - 1, m)
        for i in range(warm):
            ops.append(("F", i, 0))
        for i in range(m - warm):
            ops.append(("F", warm + i, 0))
            ops.append(("B", i, 0))
        for i in range(m - warm, m):
            ops.append(("B", i, 0))
        return ops
    total, group = m * v, pp * v
    micro = lambda k: k // group * pp + k % pp  # noqa: E731
    chunk = lambda k: k % group // pp  # noqa: E731
    warm = total if m == pp else min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    for k in range(warm):
        ops.append(("F", micro(k), chunk(k)))
    for k in range(total - warm):
        ops.append(("F", micro(warm + k), chunk(warm + k)))
        ops.append(("B", micro(k), v - 1 - chunk(k)))
    for k in range(total - warm, total):
        ops.append(("B", micro(k), v - 1 - chunk(k)))
    return ops


def simulate(pp, v, m, tf, tb, delay=Fraction(0), extra=Fraction(0)):
    """Runs every rank's schedule as a timeline and returns (step time, per-rank idle time): a pass
    starts when its rank is free and its input has arrived (a forward needs the previous virtual
    stage's forward, a backward the next one's backward, the last stage's backward its own forward),
    `delay` after the pass it depends on when that ran on another virtual stage (an asynchronous
    send). A forward of a chunk takes tf / v (+ extra: a blocking send), a backward tb / v (+ extra).
    Virtual stage of rank r's chunk c: c pp + r."""
    S = pp * v
    ops = [engine_schedule(pp, v, r, m) for r in range(pp)]
    done, pos, free, busy = {}, [0] * pp, [Fraction(0)] * pp, [Fraction(0)] * pp
    moved = True
    while moved:
        moved = False
        for r in range(pp):
            while pos[r] < len(ops[r]):
                kind, mb, c = ops[r][pos[r]]
                s = c * pp + r
                if kind == "F":
                    dep, cost = (("F", mb, s - 1) if s > 0 else None), tf / v + extra
                else:
                    dep, cost = (("B", mb, s + 1) if s < S - 1 else ("F", mb, s)), tb / v + extra
                if dep is not None and dep not in done:
                    break
                start = free[r] if dep is None else max(free[r], done[dep] + (delay if dep[0] == kind else 0))
                done[(kind, mb, s)] = start + cost
                free[r] = start + cost
                busy[r] += cost
                pos[r] += 1
                moved = True
    if any(pos[r] != len(ops[r]) for r in range(pp)):
        raise SystemExit("pipeline schedule pp %d v %d m %d deadlocks" % (pp, v, m))
    end = max(free)
    return end, [end - b for b in busy]


def tool_module():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import scaling  # noqa: E402
    return scaling


def check_pipeline(kvshift):
    """Pipeline parallelism: the bubble (pp - 1) / (m v) against idle time counted on the engine's
    schedule, the p2p formulas against the same timeline with transfers, the tool's schedule and
    micro-batches in flight against the engine's (kvshift info), the stage split against the config
    check, per-stage memory summing to the whole model, and the layouts where pp wins."""
    sc = tool_module()
    cfg = os.path.join(PAPER, "19B-kvshift.json")
    tf, tb = Fraction(1), Fraction(2)
    # 1. The bubble: on the timeline (uniform stages, no transfer time) every rank idles exactly
    # (pp - 1) / v x (tf + tb), i.e. the step is (m + (pp - 1) / v) (tf + tb): (pp - 1) / (m v) of the
    # ideal m (tf + tb). Every shape the engine runs, m < pp and interleaving with m = pp included.
    shapes, exact, same_schedule = 0, 0, 0
    for pp in (2, 3, 4, 6, 8):
        for v in (1, 2, 3, 4):
            for m in range(1, 25):
                if v > 1 and m % pp:
                    continue
                shapes += 1
                end, idle = simulate(pp, v, m, tf, tb)
                if (end - m * (tf + tb)) / (m * (tf + tb)) == Fraction(pp - 1, m * v) and \
                        all(x == Fraction(pp - 1, v) * (tf + tb) for x in idle):
                    exact += 1
                if all(sc.pipeline_schedule(pp, v, r, m) == engine_schedule(pp, v, r, m) for r in range(pp)):
                    same_schedule += 1
    check(exact == shapes, "bubble: the engine's schedules idle every rank (pp - 1)/(m v) of the ideal step, "
          "%d of %d shapes (pp 2-8, v 1-4, m 1-24)" % (exact, shapes))
    check(same_schedule == shapes, "the tool's pipeline_schedule is the engine's, %d of %d shapes" % (same_schedule, shapes))
    # 2. P2P, with c the time of one send: a pass that waits for its send (serial) makes the step
    # (m + (pp - 1)/v)(tf + tb) + 2 c (m v + pp - 1) exactly; asynchronous sends (the tool's overlap)
    # expose at most 2 c ((pp - 1) m / pp + pp - 1) (1F1B) or 2 c (pp v - 1) (interleaved), and no
    # less than that minus 2 c (pp - 1), while c is at most half a chunk's forward.
    serial_ok, overlap_ok, cases = 0, 0, 0
    for pp in (2, 4, 8):
        for v in (1, 2, 4):
            for m in (pp, 2 * pp, 3 * pp, 8 * pp):
                for c in (Fraction(1, 50), Fraction(1, 2 * v)):
                    cases += 1
                    base = (m + Fraction(pp - 1, v)) * (tf + tb)
                    serial, _ = simulate(pp, v, m, tf, tb, extra=c)
                    serial_ok += serial == base + 2 * c * (m * v + pp - 1)
                    ovl, _ = simulate(pp, v, m, tf, tb, delay=c)
                    bound = 2 * c * (Fraction((pp - 1) * m, pp) + pp - 1 if v == 1 else pp * v - 1)
                    overlap_ok += bound - 2 * c * (pp - 1) <= ovl - base <= bound
    check(serial_ok == cases, "p2p serial: 2 c (m v + pp - 1) on the timeline, %d of %d cases" % (serial_ok, cases))
    check(overlap_ok == cases, "p2p overlapped: within 2 c (pp - 1) below the tool's bound, %d of %d cases"
          % (overlap_ok, cases))

    # 3. The engine's own schedule: kvshift info's micro-batches in flight per stage (its activation
    # slots) equal the tool's; 1F1B keeps pp - r on rank r, interleaving more.
    agree = []
    for pp, v, m in ((4, 1, 8), (4, 1, 2), (2, 2, 4), (4, 2, 8), (4, 3, 12), (3, 2, 3)):
        j = info(kvshift, cfg, "parallel.pp=%d" % pp, "parallel.virtual_stages=%d" % v,
                 "train.grad_accum_steps=%d" % m, "train.seq_len=64")
        engine = [st["micro_batches_in_flight"] for st in j["pipeline_stages"]]
        ours = [sc.micro_batches_in_flight(pp, v, r, m) for r in range(pp)]
        agree.append(engine == ours)
        if engine != ours:
            print("      pp %d v %d m %d: kvshift info %s, the tool %s" % (pp, v, m, engine, ours))
    check(all(agree), "micro-batches in flight per stage = kvshift info's pipeline_stages (6 shapes)")
    check([sc.micro_batches_in_flight(4, 1, r, 8) for r in range(4)] == [4, 3, 2, 1] and
          [sc.micro_batches_in_flight(4, 2, r, 8) for r in range(4)] == [8, 8, 7, 5] and
          [sc.chunk_passes_in_flight(4, 2, r, 8) for r in range(4)] == [11, 9, 7, 5],
          "1F1B pp 4: 4, 3, 2, 1 in flight; interleaved v 2: 8 slots on rank 0, 11 chunk passes = pp + (pp-1)/v stages")

    # 4. Shapes: the tool refuses what kvshift refuses (layers not split into pp x v stages, virtual
    # stages without pp, interleaving over micro-batches not a multiple of pp), and takes the rest.
    for pp, v, m in ((5, 1, 5), (4, 8, 8), (1, 2, 2), (4, 3, 6), (4, 3, 8), (3, 2, 6), (4, 1, 6), (16, 3, 16)):
        r = subprocess.run([kvshift, "info", "--config", cfg, "--json", "--set", "device=cpu",
                            "--set", "parallel.pp=%d" % pp, "--set", "parallel.virtual_stages=%d" % v,
                            "--set", "train.grad_accum_steps=%d" % m, "--set", "train.seq_len=64"],
                           capture_output=True, text=True)
        why = sc.pp_error({"num_hidden_layers": 48}, pp, v, m)
        check((r.returncode == 0) == (why is None),
              "pp %d v %d over %d micro-batches: kvshift %s, the tool %s" %
              (pp, v, m, "accepts" if r.returncode == 0 else "refuses", why or "accepts"), r.stderr.strip())
    for args, part in ((["--pp", "5"], "--pp 5: pp x virtual stages (5 x 1) does not divide the 48 layers"),
                       (["--pp", "4", "--virtual-stages", "5"], "--pp 4: pp x virtual stages (4 x 5) does not divide"),
                       (["--pp", "two"], "--pp must be a positive integer or 'all'")):
        r = tool("--config", cfg, "--gpus", "240", *args)
        err = r.stderr.strip()
        check(r.returncode == 1 and err.startswith("scaling: error:") and part in err and "\n" not in err,
              "error: %s" % part, err)
    base = ("--config", cfg, "--gpus", "64", "--pp", "4", "--virtual-stages", "2", "--cp", "1", "--tp", "4", "--all")
    r6, j8 = tool(*base, "--global-batch", "24"), tool_json(*base, "--global-batch", "32")  # dp 4: m = 6 and 8
    check(r6.returncode == 1 and "micro-batches per replica (6) to be a multiple of pp 4" in r6.stderr and
          any(x["dp"] == 4 and x["pp"] == 4 and x["v"] == 2 for x in j8["rows"]),
          "interleaving pp 4 x v 2 at dp 4: refused over 6 micro-batches per replica, taken over 8", r6.stderr)
    # kvshift info --processes applies train's rule: 64 processes at tp 4, pp 4 are dp 4.
    runs = [subprocess.run([kvshift, "info", "--config", cfg, "--processes", n, "--set", "device=cpu",
                            "--set", "parallel.tp=4", "--set", "parallel.pp=4", "--set", "parallel.virtual_stages=2",
                            "--set", "train.grad_accum_steps=%d" % m, "--json"], capture_output=True, text=True)
            for n, m in (("64", 24), ("64", 32), ("60", 32))]
    ok32 = runs[1].returncode == 0 and json.loads(runs[1].stdout)
    check(runs[0].returncode == 1 and "(train.grad_accum_steps / dp = 6) to be a multiple of parallel.pp (4)"
          in runs[0].stderr and runs[0].stderr.count("\n") == 1 and ok32 and ok32["dp"] == 4 and
          ok32["micro_batches_per_replica"] == 8 and
          [st["micro_batches_in_flight"] for st in ok32["pipeline_stages"]] ==
          [sc.micro_batches_in_flight(4, 2, r, 8) for r in range(4)] and
          runs[2].returncode == 1 and "must divide the number of processes (60)" in runs[2].stderr,
          "kvshift info --processes: dp 4 refuses 6 micro-batches per replica, plans 8 as the tool does; 60 "
          "processes do not split into pp 4 x tp 4", runs[0].stderr + runs[2].stderr)

    # 5. Memory: the stages' parameters sum to the whole model (with tied embeddings, plus the last
    # stage's copy); what one micro-batch keeps on each stage sums to what it keeps in the whole model.
    _, m19, _ = sc.load_config(cfg)
    for tp in (1, 4):
        for pp, v in ((2, 1), (4, 3), (8, 2)):
            whole = sum(sc.local_tensors(m19, tp))
            parts = [sum(sc.stage_tensors(m19, tp, pp, v, r)) for r in range(pp)]
            check(sum(parts) == whole, "19B tp %d pp %d: the stages' parameters sum to the model's (%d)" % (tp, pp, whole))
    tied = dict(m19, tie_word_embeddings=True)
    parts = [sum(sc.stage_tensors(tied, 4, 4, 1, r)) for r in range(4)]
    check(sum(parts) == sum(sc.local_tensors(tied, 4)) + 12032 * C19 and parts[3] == parts[0] + C19,
          "tied embeddings: the last stage holds its own copy of the embedding (12032 x 6144 at tp 4)")
    # What one more micro-batch in flight costs (CudaPlan's per-slot buffers): over 4 stages the
    # model's, plus on each stage after the first the input it receives and its copy of the batch
    # (tokens, targets, mask). kvshift info's own stage plans: check_cuda_plan_layouts.
    res, batch = align(12288 // 4 * C19 * 2), 3 * align(12288 * 4)
    for rc in ("none", "attention", "full"):
        def kept(layers, head, tensors):
            one, two = (sc.cuda_activations(m19, 4, 1, 12288, rc, True, 1,
                                            {"layers": layers, "runs": 1, "head": head, "slots": k, "tensors": tensors})
                        for k in (1, 2))
            return two["total"] - one["total"]
        whole = kept(48, True, sc.local_tensors(m19, 4))
        parts = [kept(12, r == 3, sc.stage_tensors(m19, 4, 4, 1, r)) for r in range(4)]
        head = res + align(12288 // 4 * 4) + align(12288 * 12032 * 2) + align(12288 * 4)  # lnf, rstdf, logits, losses
        check(sum(parts) == whole + 3 * (res + batch) and (rc != "full" or whole == 49 * res + head + batch),
              "recompute %s: a micro-batch's buffers over 4 stages sum to the model's, plus 3 received inputs "
              "and batches (%.2f GiB)" % (rc, whole / 2**30))

    # 6. 19B on 240 GPUs, dp 15 x pp 4 x tp 4: 16 micro-batches per replica; by hand.
    j = tool_json("--config", cfg, "--gpus", "240", "--pp", "4", "--cp", "1", "--tp", "4", "--sp", "off")
    x = search_row_pp(j, 15, 4, 1, 1, 4, False)
    msg = 12288 * C19 * 2  # [rows, h] bf16: 151 MB
    check(x["micro_batches_per_gpu"] == 16 and close(x["pp_bubble_fraction"], 3 / 16) and
          x["pp_p2p_bytes_per_message"] == msg and close(x["pp_p2p_bytes_per_gpu"], 16 * 2 * msg),
          "dp 15 x pp 4 x tp 4: m = 16, bubble 3/16, 2 x 16 sends of 12288 x 6144 x 2 B = %.1f MB" % (msg / 1e6))
    # Stages are 4 consecutive GPUs (tp): a replica's 16 GPUs fill two nodes, so stage 1 -> 2 crosses.
    check(x["pp_boundary_links"]["forward"] == ["nvlink", "ib", "nvlink"] and x["pp_p2p_link"] == "ib" and
          close(x["pp_p2p_message_s"], msg / 50e9 + 22.4 * US) and
          close(x["pp_p2p_s"], 2 * (msg / 50e9 + 22.4 * US) * (16 + 3)) and close(x["latency_us"]["pp_send"], 22.4),
          "dp 15 x pp 4 x tp 4: the middle boundary over InfiniBand, a send 8.4 + 14 us; serial p2p 2 c (m + pp - 1)")
    t = [st["params"] for st in x["stages"]]
    check(t[0] == 12 * (params_19b(4) - 2 * 12032 * C19 - C19) // 48 + 12032 * C19 and
          t[3] == t[0] + C19 and t[1] == t[2] == t[0] - 12032 * C19,
          "dp 15 x pp 4 x tp 4: 12 layers per stage, the embedding on the first, norm + LM head on the last")
    slowest = max(st["params"] for st in x["stages"])
    check(close(x["dp_reduce_bytes_per_gpu"], 14 / 15 * 4 * slowest) and x["grad_group"] == 15,
          "ZeRO-1 over each stage's 15 dp ranks: the largest stage's (the last) gradients")
    per_mb = x["compute_s"] / 16 * (1 + x["pp_imbalance_s"] / x["compute_s"]) + x["tp_comm_s"] / 16
    check(close(x["pp_bubble_s"], 3 * per_mb) and
          close(x["step_s"], x["compute_s"] + x["pp_imbalance_s"] + x["tp_comm_s"] + x["pp_bubble_s"] + x["pp_p2p_s"] +
                x["dp_comm_s"]),
          "step = compute + imbalance + TP + bubble (pp - 1 passes of the slowest stage) + p2p + DP")
    check([st["micro_batches_in_flight"] for st in x["stages"]] == [4, 3, 2, 1] and x["memory_stage"] in (0, 3),
          "activations: pp - r micro-batches in flight on stage r; the first or last stage needs the most")
    check(x["pp_imbalance_s"] > 0 and
          close(x["pp_imbalance_s"] / x["compute_s"],
                (12 * (134044618752 - 6 * 48000 * C19 - 6 * C19) / 48 + 6 * 48000 * C19 + 6 * C19) /
                (134044618752 / 4) - 1),
          "imbalance: the last stage's LM head, %.1f%% over a quarter of the model" %
          (100 * x["pp_imbalance_s"] / x["compute_s"]))

    # 7. Where pp wins. 19B on 1024 GPUs: the 240-sequence batch allows at most dp 16 (a divisor of both),
    # so without pp a replica needs cp 16, whose ring no longer hides; pp 4 keeps cp at 8.
    rec = tool_json("--config", cfg, "--recommend", "--gpus", "240,1024", "--gpu-mem-gib", "76")
    r240, r1024 = rec
    check(r240["best"]["layout"] == "dp 30 x cp 4 x tp 2" and r240["best"]["pp"] == 1,
          "19B on 240 GPUs, 76 GiB: dp 30 x cp 4 x tp 2, no pipeline (%s)" % r240["best"]["layout"])
    # In 80 GiB dp 40 x cp 3 x tp 2 (76.6 GiB) ties with it: both rings hide, both reduce the same gradients over
    # 120 ranks, and its 6 micro-batches per GPU pay 6 x 194 TP all-reduces of 15.2 us against cp 4's 8 x 194.
    j = tool_json("--config", cfg, "--gpus", "240", "--cp", "all", "--sp", "off")
    c3, c4 = search_row(j, 40, 3, 2, False), search_row(j, 30, 4, 2, False)
    check(close(c3["tp_latency_s"], 6 * 194 * 15.2 * US) and close(c4["tp_latency_s"], 8 * 194 * 15.2 * US) and
          c3["cp_ring_hides"] and c4["cp_ring_hides"] and
          0 < c4["step_overlap_s"] - c3["step_overlap_s"] < 0.002 * c4["step_overlap_s"] and
          j["recommended"]["layout"] == "dp 40 x cp 3 x tp 2",
          "19B on 240 GPUs, 80 GiB: dp 40 x cp 3 x tp 2 %.3f s, dp 30 x cp 4 x tp 2 %.3f s: within 0.2 %%, 1.5 ms of "
          "TP latency a micro-batch fewer" % (c3["step_overlap_s"], c4["step_overlap_s"]))
    check(r1024["best"]["pp"] > 1 and
          r1024["best_without_pp"]["step_overlap_s"] > 1.2 * r1024["best"]["step_overlap_s"],
          "19B on 1024 GPUs: %s beats %s by %.0f%%" % (r1024["best"]["layout"], r1024["best_without_pp"]["layout"],
                                                       100 * (r1024["best_without_pp"]["step_overlap_s"] /
                                                              r1024["best"]["step_overlap_s"] - 1)))
    # 6.7B, 64 replicas of 16 GPUs (micro-batch 1, 8 per replica): tp 16 spans two nodes and its
    # all-reduces run over InfiniBand (8 NICs a node: 400 GB/s, near NVLink's 450, but every micro-batch
    # of the replica pays them); pp 2 x tp 8 keeps TP in the node and sends one [2048, 4096] activation
    # per micro-batch across.
    cfg67 = os.path.join(PAPER, "6.7B-kvshift.json")
    j = tool_json("--config", cfg67, "--gpus", "1024", "--micro-batch", "1", "--cp", "1", "--pp", "all", "--sp", "off")
    tp16, pp2 = search_row_pp(j, 64, 1, 1, 1, 16, False), search_row_pp(j, 64, 2, 1, 1, 8, False)
    # TP 16 across two nodes: an all-reduce of 16 ranks on 2 nodes has 30 steps, 2 across nodes, and NCCL
    # multiplies it by 1.4: (8.4 + 28 x 3.4 + 2 x 14) x 1.4 = 184.24 us, 4 x 32 + 2 = 130 per micro-batch.
    ar16 = (8.4 + 28 * 3.4 + 2 * 14.0) * 1.4
    check(abs(ar16 - 184.24) < 1e-9 and close(tp16["latency_us"]["tp_all_reduce"], ar16) and tp16["tp_nodes"] == 2 and
          close(tp16["tp_latency_s"], 8 * 130 * ar16 * US) and close(pp2["latency_us"]["tp_all_reduce"], 8.4 + 14 * 3.4),
          "TP 16 across two nodes: (8.4 + 28 x 3.4 + 2 x 14) x 1.4 = 184.24 us an all-reduce (tp 8 in a node: 56.0), "
          "8 x 130 of them a step: %.3f s" % (8 * 130 * ar16 * US), str(tp16["latency_us"]))
    check(tp16["tp_link"] == "ib" and tp16["tp_nics_per_node"] == 8 and
          close(tp16["tp_comm_s"], tp16["tp_bytes_per_gpu"] / 400e9 + 8 * 130 * ar16 * US) and pp2["tp_link"] == "nvlink" and
          pp2["pp_p2p_link"] == "ib" and pp2["step_overlap_s"] < tp16["step_overlap_s"] and pp2["fits"] and tp16["fits"],
          "6.7B, 16 GPUs per replica: pp 2 x tp 8 (%.3f s) beats tp 16 across nodes (%.3f s)"
          % (pp2["step_overlap_s"], tp16["step_overlap_s"]))
    r = tool("--config", cfg67, "--gpus", "1024", "--micro-batch", "1", "--cp", "1", "--pp", "all")
    check(r.returncode == 0 and "PP p2p per micro-batch" in r.stdout and "bubble" in r.stdout and
          "fastest layout that fits: dp" in r.stdout, "the layout table with pipelines prints", r.stderr)
    check_recommend_1024()


def check_recommend_1024():
    """1.5B and 6.7B on 1024 GPUs at the paper's micro-batch 8 (512 sequences: dp <= 64, one micro-batch per
    replica of 16 GPUs), the doc's --recommend tables. With NCCL's latency 1.5B keeps TP in a node; 6.7B still
    runs tp 16 across two nodes: NCCL's model charges it 130 x 184.24 us = 24 ms a step, and every layout with TP
    in a node reduces its gradients over dp x cp >= 128 ranks (ring latency ~ 1.1-1.8 ms a bucket) or runs a
    pipeline with one micro-batch (a whole pass of bubble)."""
    picks = {}
    for name in ("1.5B", "6.7B"):
        picks[name] = tool_json("--config", os.path.join(PAPER, name + "-kvshift.json"), "--recommend", "--gpus", "1024",
                                "--gpu-mem-gib", "76")[0]
    b15, b67 = picks["1.5B"]["best"], picks["6.7B"]["best"]
    check(b15["tp"] <= 8 and b15["tp_link"] == "nvlink" and b15["layout"] == "dp 64 x pp 2 x cp 2 x tp 4" and
          picks["1.5B"]["best_without_pp"]["tp"] == 16 and
          picks["1.5B"]["best_without_pp"]["step_overlap_s"] > 1.2 * b15["step_overlap_s"],
          "1.5B on 1024 GPUs: %s (%.3f s) keeps TP in a node; the fastest without pp is %s (%.3f s)"
          % (b15["layout"], b15["step_overlap_s"], picks["1.5B"]["best_without_pp"]["layout"],
             picks["1.5B"]["best_without_pp"]["step_overlap_s"]))
    check(b67["layout"] == "dp 64 x cp 1 x tp 16" and b67["tp_nodes"] == 2 and
          close(b67["tp_latency_s"], 130 * 184.24 * US) and close(b67["latency_us"]["dp_reduce"], 8.4 + 63 * 14.0),
          "6.7B on 1024 GPUs: NCCL's latency does not move dp 64 x tp 16 (%.3f s, %.1f ms of it TP latency): its "
          "gradient groups are 64 ranks, one a node (8.4 + 63 x 14 us a bucket)" %
          (b67["step_overlap_s"], 1e3 * b67["tp_latency_s"]))
    j = tool_json("--config", os.path.join(PAPER, "6.7B-kvshift.json"), "--gpus", "1024", "--cp", "all", "--pp", "all",
                  "--virtual-stages", "all", "--gpu-mem-gib", "76")
    inside = min((x for x in j["rows"] if x["fits"] and x["tp"] <= 8), key=lambda x: x["step_overlap_s"])
    check(inside["layout"] == "dp 64 x pp 2 x cp 2 x tp 4" and inside["step_overlap_s"] > 1.1 * b67["step_overlap_s"],
          "6.7B on 1024 GPUs: the fastest with TP in a node, %s, takes %.3f s (+%.0f %%)"
          % (inside["layout"], inside["step_overlap_s"], 100 * (inside["step_overlap_s"] / b67["step_overlap_s"] - 1)))


def check_latency_flags():
    """The latency flags: in --help and the JSON's assumptions with NCCL's defaults; all three 0 is the
    bandwidth-only model (every time its bytes over the link); negative values are one-line errors."""
    cfg = os.path.join(PAPER, "19B-kvshift.json")
    r = tool("--help")
    check(all(f in r.stdout for f in ("--nccl-base-latency-us", "--nvlink-latency-us", "--ib-latency-us")),
          "--help lists the latency flags")
    j = tool_json("--config", cfg, "--gpus", "240")
    a = j["assumptions"]
    check((a["nccl_base_latency_us"], a["nvlink_latency_us"], a["ib_latency_us"],
           a["nccl_allreduce_across_nodes_factor"]) == (8.4, 3.4, 14.0, 1.4) and "tuning.cc" in a["latency_source"],
          "JSON assumptions: NCCL's Ring/Simple 8.4, 3.4, 14.0 us and 1.4", str(a))
    zero = ("--nccl-base-latency-us", "0", "--nvlink-latency-us", "0", "--ib-latency-us", "0")
    z = tool_json("--config", cfg, "--gpus", "256", "--seq-len", "32768", "--global-batch", "96", "--cp", "all", *zero)
    d = tool_json("--config", cfg, "--gpus", "256", "--seq-len", "32768", "--global-batch", "96", "--cp", "all")
    x0, x1 = search_row(z, 16, 8, 2, False), search_row(d, 16, 8, 2, False)
    check(all(x["latency_s"] == 0 for x in z["rows"]) and close(x0["tp_comm_s"], 6 * 194 * 4096 * C19 * 2 / 450e9) and
          close(x0["dp_comm_s"], 127 / 128 * 6 * params_19b(2) / (4 * 50e9)) and
          close(x1["step_s"] - x0["step_s"], x1["latency_s"]) and x1["latency_s"] > 0,
          "latency 0: the bandwidth-only model; with NCCL's the serial step grows by exactly the latency (%.3f s)"
          % x1["latency_s"])
    r = tool("--config", cfg, "--gpus", "240", "--ib-latency-us", "-1")
    err = r.stderr.strip()
    check(r.returncode == 1 and err == "scaling: error: --ib-latency-us must be at least 0", "error: negative latency", err)


def align(n):
    return (n + 255) // 256 * 256


def search_row_pp(j, dp, pp, v, cp, tp, sp):
    return next(x for x in j["rows"] if (x["dp"], x["pp"], x["v"], x["cp"], x["tp"], x["sp"]) == (dp, pp, v, cp, tp, sp))


if __name__ == "__main__":
    sys.exit(main())
