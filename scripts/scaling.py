#!/usr/bin/python3
"""Scaling on paper: bytes each GPU sends per step, predicted step time and
scaling efficiency of a kvshift config under DP, ZeRO-1 and TP layouts.

    scripts/scaling.py --config configs/paper/19B-kvshift.json --gpus 240 [--tp 4]
        [--micro-batch B] [--global-batch SEQS] [--seq-len T] [--mfu 0.45]
        [--peak-tflops 989] [--nvlink-gbs 900] [--ib-gbps 400] [--gpus-per-node 8]
        [--gpu-mem-gib 80] [--json]

Without --tp every tp in 1, 2, 4, 8 that the model and --gpus allow is shown.
The model, its assumptions and the tables for the paper's configs are in
docs/scaling.md. Standard library only, so it runs before anything is built.
Errors are one line, `scaling: error: ...`, exit 1.
"""

import argparse
import json
import math
import sys

# The config keys this tool reads, with kvshift's defaults (docs/CONFIG.md).
MODEL_DEFAULTS = {"tie_word_embeddings": False, "kv_shift": {}}
TRAIN_DEFAULTS = {"micro_batch_size": 1, "grad_accum_steps": 1, "seq_len": 1024, "recompute": "none"}
BF16, FP32 = 2, 4


class UsageError(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise UsageError(msg)


def load_config(path):
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError("%s: %s" % (path, e))
    need(isinstance(cfg.get("model"), dict), "%s: no 'model' object" % path)
    model = dict(MODEL_DEFAULTS, **cfg["model"])
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        need(isinstance(model.get(k), int) and model[k] > 0, "%s: model.%s must be a positive integer" % (path, k))
    model.setdefault("num_key_value_heads", model["num_attention_heads"])
    train = dict(TRAIN_DEFAULTS, **cfg.get("train", {}))
    return cfg.get("name", path), model, train


# ---- parameters and FLOPs (the same formulas as src/model/params.cpp, flops.h) ----

def shapes(m):
    """(name, numel, kind) of every tensor, in ParamLayout order; kind as in params.h."""
    h, f, v = m["hidden_size"], m["intermediate_size"], m["vocab_size"]
    d = h // m["num_attention_heads"]
    q, kv = m["num_attention_heads"] * d, m["num_key_value_heads"] * d
    ks = m.get("kv_shift", {})
    on = ks.get("enabled", False)
    w1 = ks.get("window", 1) + 1
    out = [("embed", v * h, "embedding")]
    for _ in range(m["num_hidden_layers"]):
        out += [("norm", h, "norm"), ("q", q * h, "matrix"), ("k", kv * h, "matrix"), ("v", kv * h, "matrix"),
                ("o", h * q, "matrix")]
        if on and ks.get("shift_k", True):
            out.append(("k_shift", m["num_key_value_heads"] * w1, "shift"))
        if on and ks.get("shift_v", True):
            out.append(("v_shift", m["num_key_value_heads"] * w1, "shift"))
        if on and ks.get("shift_q", False):
            out.append(("q_shift", m["num_attention_heads"] * w1, "shift"))
        out += [("norm", h, "norm"), ("gate", f * h, "matrix"), ("up", f * h, "matrix"), ("down", h * f, "matrix")]
    out.append(("norm", h, "norm"))
    if not m["tie_word_embeddings"]:
        out.append(("lm_head", v * h, "lm_head"))
    return out


def param_counts(m):
    """As count_params(): total and non-embedding exclude the shift scalars."""
    t = shapes(m)
    total = sum(n for _, n, k in t if k != "shift")
    shift = sum(n for _, n, k in t if k == "shift")
    emb = sum(n for _, n, k in t if k in ("embedding", "lm_head"))
    return {"total": total, "shift": shift, "non_embedding": total - emb, "all": total + shift}


def flops_per_token(m, seq_len):
    """6*N_nonembedding + 6*N_lm_head + 6*L*T*d_head*n_heads (DESIGN.md; causal-halved attention)."""
    d = m["hidden_size"] // m["num_attention_heads"]
    attn = 6 * m["num_hidden_layers"] * seq_len * d * m["num_attention_heads"]
    return 6 * param_counts(m)["non_embedding"] + 6 * m["vocab_size"] * m["hidden_size"] + attn


def params_per_gpu(m, tp):
    """Parameters one GPU holds at tensor-parallel size tp: matrices and shift rows split by tp,
    embedding and LM head vocab-parallel (vocab padded to a multiple of 128*tp), norms replicated."""
    vp = math.ceil(m["vocab_size"] / (128 * tp)) * 128 * tp
    n = 0
    for name, numel, kind in shapes(m):
        if kind in ("embedding", "lm_head"):
            n += vp * m["hidden_size"] // tp
        elif kind == "norm":
            n += numel
        else:
            n += numel // tp
    return n


def tp_error(m, tp):
    """Why this tp cannot split the model (as the config check will say), or None."""
    for key in ("num_key_value_heads", "num_attention_heads", "intermediate_size"):
        if m[key] % tp:
            return "tp %d does not divide %s (%d)" % (tp, key, m[key])
    return None


# ---- communication ----

def ring_allreduce_bytes(nbytes, n):
    """Bytes each rank sends in a ring all-reduce of nbytes over n ranks: 2(n-1)/n * size."""
    return 2.0 * (n - 1) / n * nbytes if n > 1 else 0.0


def ring_half_bytes(nbytes, n):
    """Reduce-scatter or all-gather of nbytes (the full buffer) over n ranks: (n-1)/n * size."""
    return (n - 1.0) / n * nbytes if n > 1 else 0.0


def activation_bytes_per_token(m, tp):
    """bf16 activations one layer keeps for its backward without recomputation, per token on one
    GPU: norm inputs/outputs (replicated), Q/K/V, attention output, gate/up and their product."""
    h, f = m["hidden_size"], m["intermediate_size"]
    d = h // m["num_attention_heads"]
    q, kv = m["num_attention_heads"] * d, m["num_key_value_heads"] * d
    return BF16 * (4 * h + (2 * q + 2 * kv + 3 * f) / tp)


def layout(m, train, a, tp, mode):
    """One row of the table: dp x tp with gradient reduction `mode`."""
    dp = a.gpus // tp
    mb, seq = a.micro_batch, a.seq_len
    gb = a.global_batch
    need(gb % (dp * mb) == 0, "the global batch (%d sequences) is not a multiple of dp x micro-batch (%d x %d); "
         "set --global-batch or --micro-batch" % (gb, dp, mb))
    micro_steps = gb // (dp * mb)  # micro-batches each GPU runs per step
    L = m["num_hidden_layers"]
    h = m["hidden_size"]

    # Compute: the model FLOPs of the global batch, plus what recomputation repeats (full: one more
    # forward of every layer; attention: the flash forward), over every GPU at the assumed MFU.
    flops = flops_per_token(m, seq) * gb * seq
    attn_fwd = 2 * L * seq * m["hidden_size"]  # 2*L*T*d_head*n_heads: causal attention forward per token
    extra = {"none": 0, "attention": attn_fwd, "full": 2 * param_counts(m)["non_embedding"] + attn_fwd}
    recompute_flops = extra[train["recompute"]] * gb * seq
    compute_s = (flops + recompute_flops) / (a.gpus * a.mfu * a.peak_tflops * 1e12)

    # TP: all-reduce [b, s, h] bf16 after each row-parallel layer: 2 per layer forward, 2 backward,
    # plus the vocab-parallel embedding's forward and the LM head's input gradient (2 per micro-batch);
    # full recomputation repeats the 2 forward ones.
    per_layer = 4 + (2 if train["recompute"] == "full" else 0)
    tp_calls = micro_steps * (per_layer * L + 2)
    tp_bytes = tp_calls * ring_allreduce_bytes(mb * seq * h * BF16, tp)
    tp_bw = a.nvlink_gbs * 1e9 if tp <= a.gpus_per_node else a.ib_gbps / 8 * 1e9
    tp_s = tp_bytes / tp_bw

    # DP: the gradients of the GPU's parameters (fp32 in kvshift's engines, or bf16), reduced over dp
    # ranks once per step; ZeRO-1 reduce-scatters them and all-gathers the updated bf16 parameters.
    p_gpu = params_per_gpu(m, tp)
    gbytes = FP32 if a.grad_dtype == "fp32" else BF16
    if mode == "zero1":
        reduce_bytes = ring_half_bytes(p_gpu * gbytes, dp)
        gather_bytes = ring_half_bytes(p_gpu * BF16, dp)
    else:
        reduce_bytes, gather_bytes = ring_allreduce_bytes(p_gpu * gbytes, dp), 0.0
    dp_in_node = dp * tp <= a.gpus_per_node
    dp_bw = a.nvlink_gbs * 1e9 if dp_in_node else a.ib_gbps / 8 * 1e9
    reduce_s, gather_s = reduce_bytes / dp_bw, gather_bytes / dp_bw

    # Overlap: each layer's gradients are reduced as soon as its backward ends, during the rest of
    # the last micro-batch's backward (2/3 of its compute); ZeRO-1's all-gather of layer l runs
    # during the next step's forward of layers < l (1/3). One layer's share of each stays exposed.
    def exposed(comm_s, hide_s):
        return max(comm_s - hide_s, comm_s / L) if comm_s > 0 else 0.0
    micro_s = compute_s / micro_steps
    reduce_exposed, gather_exposed = exposed(reduce_s, micro_s * 2 / 3), exposed(gather_s, micro_s / 3)
    step_plain = compute_s + tp_s + reduce_s + gather_s
    step_overlap = compute_s + tp_s + reduce_exposed + gather_exposed

    # Memory per GPU: bf16 parameters and fp32 gradients whole; fp32 master + two moments (12 B)
    # sharded over dp by ZeRO-1; activations of one micro-batch (only the layer inputs and one
    # layer's worth under full recomputation; no attention output under attention recomputation).
    opt_bytes = 12 * p_gpu / (dp if mode == "zero1" else 1)
    state_bytes = (BF16 + gbytes) * p_gpu + opt_bytes
    if train["recompute"] == "full":
        act = mb * seq * L * h * BF16 + mb * seq * activation_bytes_per_token(m, tp)
    else:
        act = mb * seq * L * activation_bytes_per_token(m, tp)
        if train["recompute"] == "attention":
            act -= mb * seq * L * BF16 * m["hidden_size"] / tp
    act += mb * seq * math.ceil(m["vocab_size"] / tp) * FP32  # the logits' shard, fp32
    mem_gib = (state_bytes + act) / 2**30

    return {
        "layout": "dp %d x tp %d" % (dp, tp), "dp": dp, "tp": tp, "mode": mode,
        "grad_dtype": a.grad_dtype, "micro_batches_per_gpu": micro_steps,
        "params_per_gpu": p_gpu,
        "tp_bytes_per_gpu": tp_bytes, "dp_bytes_per_gpu": reduce_bytes + gather_bytes,
        "dp_reduce_bytes_per_gpu": reduce_bytes, "dp_gather_bytes_per_gpu": gather_bytes,
        "tp_link": "nvlink" if tp <= a.gpus_per_node else "ib", "dp_link": "nvlink" if dp_in_node else "ib",
        "compute_s": compute_s, "tp_comm_s": tp_s, "dp_comm_s": reduce_s + gather_s,
        "dp_comm_exposed_overlap_s": reduce_exposed + gather_exposed,
        "step_s": step_plain, "step_overlap_s": step_overlap,
        "efficiency": compute_s / step_plain, "efficiency_overlap": compute_s / step_overlap,
        "tokens_per_s_overlap": gb * seq / step_overlap,
        "mfu_overlap": flops / (a.gpus * a.peak_tflops * 1e12 * step_overlap),
        "memory_gib": mem_gib, "fits": mem_gib <= a.gpu_mem_gib,
    }


MODES = {"dp": "DP all-reduce", "zero1": "ZeRO-1"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--tp", type=int, help="one tensor-parallel size (default: every one of 1, 2, 4, 8 that fits)")
    p.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default: the config's)")
    p.add_argument("--global-batch", type=int, help="sequences per step (default: micro_batch_size x grad_accum_steps)")
    p.add_argument("--seq-len", type=int, help="default: the config's train.seq_len")
    p.add_argument("--recompute", choices=["none", "attention", "full"], help="default: the config's train.recompute")
    p.add_argument("--grad-dtype", choices=["fp32", "bf16"], default="fp32",
                   help="dtype of the reduced gradients (kvshift's engines accumulate fp32)")
    p.add_argument("--mfu", type=float, default=0.45, help="achieved MFU assumed for the compute (default 0.45)")
    p.add_argument("--peak-tflops", type=float, default=989, help="peak dense bf16 TFLOP/s (H100 SXM: 989)")
    p.add_argument("--nvlink-gbs", type=float, default=900, help="NVLink GB/s per GPU within a node (default 900)")
    p.add_argument("--ib-gbps", type=float, default=400, help="InfiniBand Gb/s per GPU across nodes (default 400)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--gpu-mem-gib", type=float, default=80)
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    return p.parse_args(argv)


def build(a):
    name, m, train = load_config(a.config)
    a.micro_batch = a.micro_batch or train["micro_batch_size"]
    a.seq_len = a.seq_len or train["seq_len"]
    a.global_batch = a.global_batch or train["micro_batch_size"] * train["grad_accum_steps"]
    if a.recompute:
        train["recompute"] = a.recompute
    for k in ("gpus", "micro_batch", "seq_len", "global_batch", "gpus_per_node"):
        need(getattr(a, k) >= 1, "--%s must be at least 1" % k.replace("_", "-"))
    need(0 < a.mfu <= 1, "--mfu must be in (0, 1]")
    if a.tp is not None:
        need(a.tp >= 1 and a.gpus % a.tp == 0, "--tp %d does not divide --gpus %d" % (a.tp, a.gpus))
        why = tp_error(m, a.tp)
        need(why is None, why or "")
        tps = [a.tp]
    else:
        tps = [t for t in (1, 2, 4, 8) if a.gpus % t == 0 and tp_error(m, t) is None]
    rows = [layout(m, train, a, t, mode) for t in tps for mode in MODES]
    counts = param_counts(m)
    ok = [r for r in rows if r["fits"]]
    best = max(ok, key=lambda r: r["tokens_per_s_overlap"]) if ok else None
    return {
        "config": a.config, "name": name, "gpus": a.gpus, "gpus_per_node": a.gpus_per_node,
        "global_batch_sequences": a.global_batch, "micro_batch": a.micro_batch, "seq_len": a.seq_len,
        "tokens_per_step": a.global_batch * a.seq_len, "recompute": train["recompute"],
        "params_total": counts["total"], "params_non_embedding": counts["non_embedding"],
        "params_shift": counts["shift"], "train_flops_per_token": flops_per_token(m, a.seq_len),
        "assumptions": {"mfu": a.mfu, "peak_tflops": a.peak_tflops, "nvlink_GBps": a.nvlink_gbs,
                        "ib_Gbps_per_gpu": a.ib_gbps, "grad_dtype": a.grad_dtype, "gpu_mem_gib": a.gpu_mem_gib},
        "rows": rows,
        "recommended": best and {"layout": best["layout"], "mode": best["mode"]},
    }


def gb(x):
    return "%.2f" % (x / 1e9)


def print_table(r):
    a = r["assumptions"]
    print("%s on %d GPUs (%d per node): %.2fB params, %.3g FLOP/token, %d x %d tokens per step (micro-batch %d), "
          "recompute %s" % (r["name"], r["gpus"], r["gpus_per_node"], r["params_total"] / 1e9,
                            r["train_flops_per_token"], r["global_batch_sequences"], r["seq_len"],
                            r["micro_batch"], r["recompute"]))
    print("assumed: MFU %.0f%% of %g TFLOP/s; NVLink %g GB/s in a node, InfiniBand %g Gb/s per GPU across nodes; "
          "%s gradients" % (100 * a["mfu"], a["peak_tflops"], a["nvlink_GBps"], a["ib_Gbps_per_gpu"], a["grad_dtype"]))
    head = ("layout", "grad reduction", "mb/GPU", "TP GB/GPU", "DP GB/GPU", "compute s", "TP s", "DP s",
            "step s", "eff", "step s ovl", "eff ovl", "MFU ovl", "mem GiB")
    fmt = "%-14s %-14s %6s %10s %10s %9s %7s %7s %8s %5s %10s %7s %7s %9s"
    print(fmt % head)
    for x in r["rows"]:
        print(fmt % (x["layout"], MODES[x["mode"]], x["micro_batches_per_gpu"],
                     gb(x["tp_bytes_per_gpu"]) + ("" if x["tp"] == 1 else "/" + x["tp_link"][:2]),
                     gb(x["dp_bytes_per_gpu"]) + "/" + x["dp_link"][:2],
                     "%.3f" % x["compute_s"], "%.3f" % x["tp_comm_s"], "%.3f" % x["dp_comm_s"],
                     "%.3f" % x["step_s"], "%.0f%%" % (100 * x["efficiency"]), "%.3f" % x["step_overlap_s"],
                     "%.0f%%" % (100 * x["efficiency_overlap"]), "%.1f%%" % (100 * x["mfu_overlap"]),
                     "%.1f%s" % (x["memory_gib"], "" if x["fits"] else " !")))
    print("GB/GPU: bytes each GPU sends per step (/nv NVLink, /ib InfiniBand); compute includes recomputation; "
          "eff = compute / step; MFU = model FLOPs / (step x peak); "
          "ovl = reduction overlapped with the last backward, ZeRO-1's gather with the next forward; "
          "! = over %g GiB" % a["gpu_mem_gib"])
    rec = r["recommended"]
    print("fastest layout that fits: %s" % ("%s, %s" % (rec["layout"], MODES[rec["mode"]]) if rec else
                                            "none (lower the micro-batch, recompute, or raise tp)"))


def main(argv):
    args = parse_args(argv)
    try:
        r = build(args)
    except UsageError as e:
        print("scaling: error: %s" % e, file=sys.stderr)
        return 1
    if r["rows"] == []:
        print("scaling: error: no tp in 1, 2, 4, 8 divides both --gpus and the model's heads", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(r))
    else:
        print_table(r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
