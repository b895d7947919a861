#!/usr/bin/python3
"""Scaling on paper: bytes each GPU sends per step, predicted step time, scaling
efficiency and memory per GPU of a kvshift config under DP, ZeRO-1, TP, sequence
parallelism (SP) and context parallelism (CP).

    scripts/scaling.py --config configs/paper/19B-kvshift.json --gpus 240 [--tp 4]
        [--micro-batch B] [--global-batch SEQS] [--seq-len T] [--recompute none|attention|full]
        [--grad-dtype fp32|bf16] [--master sharded|replicated] [--mfu 0.45] [--peak-tflops 989]
        [--nvlink-gbs 900] [--ib-gbps 400] [--gpus-per-node 8] [--gpu-mem-gib 80] [--json]
    scripts/scaling.py --config configs/paper/19B-kvshift.json --gpus 256 --seq-len 32768 --global-batch 96
        --cp all|N [--sp both|on|off] [--tp N] [--all] ...

Without --cp and --sp: the DP/ZeRO-1 x TP table, every tp in 1, 2, 4, 8 that the
model and --gpus allow (or --tp), each with plain DP and ZeRO-1. With --cp or
--sp: the layout search, every dp x cp x tp (x SP on/off where tp > 1) with
ZeRO-1 over dp x cp, the communication of each per layer, and the ones that fit
in --gpu-mem-gib sorted by predicted step time (--all: the others too).
The model, its assumptions and worked examples are in docs/scaling.md.
Standard library only, so it runs before anything is built. Errors are one
line, `scaling: error: ...`, exit 1.
"""

import argparse
import json
import math
import sys

# The config keys this tool reads, with kvshift's defaults (docs/CONFIG.md).
MODEL_DEFAULTS = {"tie_word_embeddings": False, "kv_shift": {}}
KV_SHIFT_DEFAULTS = {"enabled": True, "window": 1, "shift_k": True, "shift_v": True, "shift_q": False}
TRAIN_DEFAULTS = {"micro_batch_size": 1, "grad_accum_steps": 1, "seq_len": 1024, "recompute": "none"}
BF16, FP32 = 2, 4
CUBLAS_WORKSPACE = 32 * 2**20  # Matmul's cuBLASLt workspace, as kvshift info counts it


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
    model["kv_shift"] = dict(KV_SHIFT_DEFAULTS, **model["kv_shift"])
    train = dict(TRAIN_DEFAULTS, **cfg.get("train", {}))
    return cfg.get("name", path), model, train


# ---- parameters and FLOPs (the same formulas as src/model/params.cpp, flops.h) ----

def shift_flags(m):
    ks = m["kv_shift"]
    on = ks["enabled"]
    return on and ks["shift_k"], on and ks["shift_v"], on and ks["shift_q"]


def shapes(m):
    """(name, numel, kind) of every tensor, in ParamLayout order; kind as in params.h."""
    h, f, v = m["hidden_size"], m["intermediate_size"], m["vocab_size"]
    d = h // m["num_attention_heads"]
    q, kv = m["num_attention_heads"] * d, m["num_key_value_heads"] * d
    w1 = m["kv_shift"]["window"] + 1
    sk, sv, sq = shift_flags(m)
    out = [("embed", v * h, "embedding")]
    for _ in range(m["num_hidden_layers"]):
        out += [("norm", h, "norm"), ("q", q * h, "matrix"), ("k", kv * h, "matrix"), ("v", kv * h, "matrix"),
                ("o", h * q, "matrix")]
        if sk:
            out.append(("k_shift", m["num_key_value_heads"] * w1, "shift"))
        if sv:
            out.append(("v_shift", m["num_key_value_heads"] * w1, "shift"))
        if sq:
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


def padded_vocab(m, tp):
    """As padded_vocab() in src/parallel/tensor_parallel.cpp: a multiple of 128*tp, unpadded at tp 1."""
    v = m["vocab_size"]
    return v if tp <= 1 else math.ceil(v / (128 * tp)) * 128 * tp


def local_tensors(m, tp):
    """Element counts of TP rank 0's tensors (ParamLayout::build(m, 0, tp)): matrices and shift rows
    split by tp, embedding and LM head vocab-parallel over the padded vocabulary, norms replicated."""
    vp = padded_vocab(m, tp)
    out = []
    for _, numel, kind in shapes(m):
        if kind in ("embedding", "lm_head"):
            out.append(vp * m["hidden_size"] // tp)
        elif kind == "norm":
            out.append(numel)
        else:
            out.append(numel // tp)
    return out


def params_per_gpu(m, tp):
    """Parameters one GPU holds at tensor-parallel size tp (shift scalars included)."""
    return sum(local_tensors(m, tp))


def tp_error(m, tp):
    """Why this tp cannot split the model (as the config check will say), or None."""
    for key in ("num_key_value_heads", "num_attention_heads", "intermediate_size"):
        if m[key] % tp:
            return "tp %d does not divide %s (%d)" % (tp, key, m[key])
    return None


def cp_error(m, seq_len, cp):
    """Why this cp cannot split a sequence (as kvshift's config check will say), or None."""
    if cp > 1 and seq_len % (2 * cp):
        return "seq_len %d is not divisible by 2 x cp = %d" % (seq_len, 2 * cp)
    if cp > 1 and m["kv_shift"]["enabled"] and seq_len // (2 * cp) < m["kv_shift"]["window"]:
        return "chunks of seq_len / (2 x cp) = %d are shorter than the shift window" % (seq_len // (2 * cp))
    return None


# ---- activation memory: the CUDA engine's plan (CudaPlan::build in src/model/cuda_engine.cpp) ----

def align256(n):
    return (n + 255) // 256 * 256


def rmsnorm_backward_scratch_floats(n, c):
    """kernels/cuda/rmsnorm.cu: one [C] fp32 partial per backward block."""
    chunks = c // 8 if c % 8 == 0 else c
    row_threads = min(max((chunks + 31) // 32 * 32, 32), 1024)
    return max(1, min(n, (1 << 18) // row_threads)) * c if n > 0 else 0


def shift_rope_backward_scratch_floats(b, t, h, d, w):
    """kernels/cuda/shift_rope.cu: one (W+1) partial per head, sequence and tile of rows."""
    tile_rows = min(max(2048 // d, 1), 32)
    return h * b * math.ceil(t / tile_rows) * (w + 1) if b > 0 and t > 0 else 0


def cuda_activations(m, tp, micro_batch, seq_len, recompute, sp=False, cp=1):
    """Bytes of the CUDA engine's activations and workspaces on one GPU, by group.

    At sp off and cp 1 this is CudaPlan::build's arena without the parameters (fp32 master, fp32
    gradients, bf16 copy), plus the cuBLASLt workspace: kvshift info's
    memory_bytes_cuda.activations_and_workspaces, to the byte. The CUDA engine has neither SP nor CP
    yet; for them this assumes the CPU engine's layouts (docs/scaling.md):
    - SP: the residual stream (layer inputs, res_mid, the RMSNorm outputs and rstd, the final norm,
      dresid, dln) holds N/tp rows, plus two [N, C] buffers for the gathered or not-yet-scattered
      rows and the norm gains' fp32 gradients [2L+1, C] (ActivationPlan's sp_full, sp_full2, norm_grads);
    - CP: every per-token buffer holds the rank's B*T/cp rows (flash attention: no T x T term), plus
      the ring: the K/V block in hand and the one arriving, each [rows, 2 KD] bf16 with its dK/dV
      fp32 accumulators, an fp32 [rows, QD] accumulator for the merged output (and dq), a block's
      log-sum-exp, and the halo (W raw rows per chunk of every rank, and its gradient).
    Groups: residual_stream (divided by tp under SP), per_token (the other buffers with one row per
    token), sp_buffers, cp_ring, workspace (kernel scratch, batch inputs, shift coefficients, RoPE
    tables, AdamW chunk tables, cuBLASLt); total.
    """
    L, C = m["num_hidden_layers"], m["hidden_size"]
    D = C // m["num_attention_heads"]
    Hq, Hkv, F = m["num_attention_heads"] // tp, m["num_key_value_heads"] // tp, m["intermediate_size"] // tp
    V = padded_vocab(m, tp) // tp
    QD, KD = Hq * D, Hkv * D
    W = m["kv_shift"]["window"]
    W1 = W + 1
    B, T = micro_batch, seq_len
    N = B * T // cp  # this rank's rows (CP: two chunks of T / 2cp of every sequence)
    Tl = T // cp     # positions per sequence on this rank
    Nl = N // tp if sp else N  # the residual stream's rows under SP
    A = L if recompute == "none" else 1  # layers of attention outputs kept
    R = 1 if recompute == "full" else L  # layers of the other activations kept
    h2, f4 = BF16, FP32
    g = {"residual_stream": 0, "per_token": 0, "sp_buffers": 0, "cp_ring": 0, "workspace": 0}

    def take(group, nbytes):
        g[group] += align256(nbytes)

    res = align256(Nl * C * h2)
    rstd = align256(Nl * f4)
    take("residual_stream", (L + 1) * res)         # layer inputs: always kept
    take("residual_stream", 3 * R * res)           # res_mid, ln1, ln2
    take("residual_stream", 2 * R * rstd)          # rstd1, rstd2
    take("residual_stream", Nl * C * h2)           # lnf
    take("residual_stream", Nl * f4)               # rstdf
    take("residual_stream", Nl * C * h2)           # dresid
    take("residual_stream", Nl * C * h2)           # dln
    take("per_token", R * align256(N * (QD + 2 * KD) * h2))  # qkv
    take("per_token", 2 * A * align256(N * QD * h2))          # qhat, attout
    take("per_token", 2 * A * align256(N * KD * h2))          # khat, vhat
    take("per_token", R * align256(N * 2 * F * h2))           # gate_up
    take("per_token", R * align256(N * F * h2))               # h
    take("per_token", A * align256(B * Hq * Tl * f4))          # lse
    for nbytes in (N * V * h2, N * f4, N * C * h2,            # logits, losses, proj
                   N * F * h2, N * 2 * F * h2, N * QD * h2, N * QD * h2, N * KD * h2, N * KD * h2,
                   N * (QD + 2 * KD) * h2):                   # dh, dgate_up, dattout, dqhat, dkhat, dvhat, dqkv
        take("per_token", nbytes)
    if sp:
        take("sp_buffers", N * C * h2)
        take("sp_buffers", N * C * h2)
        take("sp_buffers", (2 * L + 1) * C * f4)
    if cp > 1:
        sk, sv, sq = shift_flags(m)
        halo_width = KD * (sk + sv) + QD * sq
        take("cp_ring", 2 * N * 2 * KD * (h2 + f4))          # K/V + dK/dV: the block in hand and the next
        take("cp_ring", N * QD * f4)                         # merged output (forward), dq (backward)
        take("cp_ring", B * Hq * Tl * f4)                    # one block's log-sum-exp
        take("cp_ring", 2 * cp * 2 * B * W * halo_width * h2)  # halo rows of every rank, and their gradient
    # Once: shift coefficients, RoPE tables, kernel scratch, reductions, batch inputs, AdamW chunk tables.
    coef = (Hq + 2 * Hkv) * W1 * f4
    take("workspace", L * align256(coef))
    take("workspace", T * D // 2 * f4)
    take("workspace", T * D // 2 * f4)
    take("workspace", coef)  # dcoef
    b2, t2 = (2 * B, T // (2 * cp)) if cp > 1 else (B, T)  # shift+RoPE runs per chunk under CP
    scratch = max(rmsnorm_backward_scratch_floats(Nl, C), shift_rope_backward_scratch_floats(b2, t2, Hq, D, W),
                  shift_rope_backward_scratch_floats(b2, t2, Hkv, D, W), B * Hq * Tl, 1)
    take("workspace", scratch * f4)
    take("workspace", 1024 * 8)  # fp64 reduction scratch (kSumBlocks doubles)
    take("workspace", 8)
    for nbytes in (N * 4, N * 4, N * f4, N * 4, (N + 1) * 4, N * 4, N * 4):  # tokens ... argmax
        take("workspace", nbytes)
    if tp > 1:
        take("workspace", 6 * N * f4)  # vocab-parallel loss statistics
    chunks = sum(math.ceil(n / (1 << 16)) for n in local_tensors(m, tp))
    take("workspace", chunks * 24)  # AdamWChunk {u64, u64, u32}: 24 bytes
    take("workspace", chunks * 24)
    P = sum(local_tensors(m, tp))  # the parameters' own slices are aligned too: the rest counts here
    g["workspace"] += 2 * (align256(P * f4) - P * f4) + align256(P * h2) - P * h2
    g["workspace"] += CUBLAS_WORKSPACE
    g["total"] = sum(g.values())
    return g


def state_bytes(p_gpu, grad_bytes, master, shards):
    """Parameters, gradients and optimizer state of one GPU: bf16 copy, gradients, and either
    the fp32 master with the two fp32 AdamW moments sharded over `shards` ranks (master "sharded",
    Megatron's distributed optimizer) or the fp32 master on every GPU and only the moments sharded
    (master "replicated": kvshift's engines today)."""
    if master == "sharded":
        return (BF16 + grad_bytes) * p_gpu + 12 * p_gpu / shards
    return (BF16 + grad_bytes + FP32) * p_gpu + 8 * p_gpu / shards


# ---- communication ----

def ring_allreduce_bytes(nbytes, n):
    """Bytes each rank sends in a ring all-reduce of nbytes over n ranks: 2(n-1)/n * size."""
    return 2.0 * (n - 1) / n * nbytes if n > 1 else 0.0


def ring_half_bytes(nbytes, n):
    """Reduce-scatter or all-gather of nbytes (the full buffer) over n ranks: (n-1)/n * size."""
    return (n - 1.0) / n * nbytes if n > 1 else 0.0


def tp_collectives(L, recompute, sp):
    """TP collectives of one micro-batch on [rows, h] bf16 buffers.

    Without SP, all-reduces: after o_proj and down_proj (forward), of d ln1 and d ln2 (backward) per
    layer, the embedding's output and d lnf once; full recomputation repeats the 2 forward ones.
    With SP (tp_region.h, linear.cpp): per layer the forward all-gathers the inputs of q/k/v and
    gate/up and reduce-scatters the outputs of o_proj and down_proj; the backward all-gathers the
    output gradients of down_proj and o_proj, gathers the two column groups' inputs again (they are
    not kept gathered) and reduce-scatters their input gradients: 6 all-gathers + 4 reduce-scatters
    per layer; once: embedding (reduce-scatter, backward all-gather), LM head (all-gather; backward
    all-gather + reduce-scatter). Full recomputation repeats the 2 + 2 of the forward."""
    full = recompute == "full"
    if not sp:
        return {"all_reduce": (4 + 2 * full) * L + 2}
    return {"all_gather": (6 + 2 * full) * L + 3, "reduce_scatter": (4 + 2 * full) * L + 2}


def tp_collectives_per_layer(recompute, sp):
    full = recompute == "full"
    if not sp:
        return {"all_reduce": 4 + 2 * full}
    return {"all_gather": 6 + 2 * full, "reduce_scatter": 4 + 2 * full}


def link(span, a):
    """NVLink for a group within one node (span consecutive GPUs that divide a node), else InfiniBand."""
    return "nvlink" if span <= a.gpus_per_node and a.gpus_per_node % span == 0 else "ib"


def bandwidth(kind, a):
    return a.nvlink_gbs * 1e9 if kind == "nvlink" else a.ib_gbps / 8 * 1e9


def predict(m, train, a, dp, cp, tp, sp, mode):
    """One layout: dp x cp x tp (SP on or off), gradient reduction `mode` over the dp x cp ranks."""
    mb, seq, gb = a.micro_batch, a.seq_len, a.global_batch
    micro_steps = gb // (dp * mb)  # micro-batches each GPU runs per step (a TP x CP group shares one)
    L, h = m["num_hidden_layers"], m["hidden_size"]
    d_head = h // m["num_attention_heads"]
    recompute = train["recompute"]
    rows = mb * seq // cp  # rows of a micro-batch on one GPU before SP

    # Compute: the model FLOPs of the global batch, plus what recomputation repeats (full: one more
    # forward of every layer; attention: the flash forward), over every GPU at the assumed MFU.
    # CP's load-balanced chunks give every rank the same share of the causal attention.
    flops = flops_per_token(m, seq) * gb * seq
    attn_fwd = 2 * L * seq * h  # 2*L*T*d_head*n_heads: causal attention forward per token
    extra = {"none": 0, "attention": attn_fwd, "full": 2 * param_counts(m)["non_embedding"] + attn_fwd}
    recompute_flops = extra[recompute] * gb * seq
    achieved = a.mfu * a.peak_tflops * 1e12  # FLOP/s of one GPU
    compute_s = (flops + recompute_flops) / (a.gpus * achieved)

    # TP (or SP): collectives of [rows, h] bf16 per micro-batch, on the critical path.
    coll = tp_collectives(L, recompute, sp)
    tp_buf = rows * h * BF16
    tp_bytes = micro_steps * (coll.get("all_reduce", 0) * ring_allreduce_bytes(tp_buf, tp) +
                              (coll.get("all_gather", 0) + coll.get("reduce_scatter", 0)) *
                              ring_half_bytes(tp_buf, tp))
    tp_link = link(tp, a)
    tp_s = tp_bytes / bandwidth(tp_link, a)

    # CP: per layer and micro-batch the ring passes this rank's K/V block [rows, 2 KD/tp] bf16 cp - 1
    # times forward, and cp times backward with its fp32 dK/dV accumulators; the halo all-gathers W raw
    # rows of k, v (and q) per chunk forward and their gradients backward. Recomputing attention
    # repeats the forward ring and halo. The ring can hide behind the attention of the block in hand:
    # one step's attention is 1/cp of the rank's causal attention (2 T^2 d_head n_heads / (tp cp)
    # FLOPs per sequence forward, twice that backward), at the assumed MFU.
    kd = m["num_key_value_heads"] // tp * d_head
    qd = m["num_attention_heads"] // tp * d_head
    sk, sv, sq = shift_flags(m)
    W = m["kv_shift"]["window"]
    fwd_rings = 1 + (recompute != "none")
    block = rows * 2 * kd  # K and V rows of this rank's two chunks
    ring_fwd_step, ring_bwd_step = block * BF16, block * (BF16 + FP32)
    ring_layer = fwd_rings * (cp - 1) * ring_fwd_step + cp * ring_bwd_step if cp > 1 else 0
    halo_piece = 2 * mb * W * (kd * (sk + sv) + qd * sq) * BF16  # this rank's rows of one all-gather
    halo_layer = (fwd_rings + 1) * (cp - 1) * halo_piece if cp > 1 else 0
    cp_link = link(cp * tp, a)
    cp_bw = bandwidth(cp_link, a)
    cp_bytes = micro_steps * L * (ring_layer + halo_layer)
    cp_s = cp_bytes / cp_bw
    attn_step_fwd = 2.0 * mb * seq * seq * d_head * m["num_attention_heads"] / (tp * cp * cp) / achieved
    if cp > 1:
        ratio_fwd = ring_fwd_step / cp_bw / attn_step_fwd
        ratio_bwd = ring_bwd_step / cp_bw / (2 * attn_step_fwd)
        exposed_layer = (fwd_rings * (cp - 1) * max(0.0, ring_fwd_step / cp_bw - attn_step_fwd) +
                         cp * max(0.0, ring_bwd_step / cp_bw - 2 * attn_step_fwd))
        cp_exposed = micro_steps * L * (exposed_layer + halo_layer / cp_bw)
    else:
        ratio_fwd = ratio_bwd = 0.0
        cp_exposed = 0.0

    # Gradients: summed over the dp x cp ranks holding the same weights (CP ranks each compute a share
    # of every sequence's gradient), once per step; ZeRO-1 reduce-scatters them and all-gathers the
    # updated parameters (bf16, or the fp32 master that kvshift's engines gather when it is replicated).
    n = dp * cp
    p_gpu = params_per_gpu(m, tp)
    gbytes = FP32 if a.grad_dtype == "fp32" else BF16
    if mode == "zero1":
        reduce_bytes = ring_half_bytes(p_gpu * gbytes, n)
        gather_bytes = ring_half_bytes(p_gpu * (BF16 if a.master == "sharded" else FP32), n)
    else:
        reduce_bytes, gather_bytes = ring_allreduce_bytes(p_gpu * gbytes, n), 0.0
    dp_link = link(a.gpus, a)
    reduce_s, gather_s = reduce_bytes / bandwidth(dp_link, a), gather_bytes / bandwidth(dp_link, a)

    # Overlap: each layer's gradients are reduced as soon as its backward ends, during the rest of
    # the last micro-batch's backward (2/3 of its compute); ZeRO-1's all-gather of layer l runs
    # during the next step's forward of layers < l (1/3). One layer's share of each stays exposed.
    def exposed(comm_s, hide_s):
        return max(comm_s - hide_s, comm_s / L) if comm_s > 0 else 0.0
    micro_s = compute_s / micro_steps
    reduce_exposed, gather_exposed = exposed(reduce_s, micro_s * 2 / 3), exposed(gather_s, micro_s / 3)
    step_plain = compute_s + tp_s + cp_s + reduce_s + gather_s
    step_overlap = compute_s + tp_s + cp_exposed + reduce_exposed + gather_exposed

    # Memory per GPU: parameters, gradients and optimizer state (ZeRO-1 shards over dp x cp), and the
    # CUDA engine's activations and workspaces for one micro-batch.
    st = state_bytes(p_gpu, gbytes, a.master, n if mode == "zero1" else 1)
    act = cuda_activations(m, tp, mb, seq, recompute, sp, cp)
    mem_gib = (st + act["total"]) / 2**30

    label = ("dp %d x tp %d" % (dp, tp) if a.search is None else
             "dp %d x cp %d x tp %d%s" % (dp, cp, tp, " SP" if sp else ""))
    return {
        "layout": label, "dp": dp, "cp": cp, "tp": tp, "sp": sp, "mode": mode,
        "grad_dtype": a.grad_dtype, "micro_batches_per_gpu": micro_steps,
        "params_per_gpu": p_gpu,
        "tp_collectives_per_layer": tp_collectives_per_layer(recompute, sp) if tp > 1 else {},
        "tp_collectives_per_micro_batch": coll if tp > 1 else {},
        "tp_buffer_bytes": tp_buf if tp > 1 else 0,
        "tp_bytes_per_gpu": tp_bytes, "tp_link": tp_link, "tp_comm_s": tp_s,
        "cp_ring_bytes_per_layer": ring_layer, "cp_halo_bytes_per_layer": halo_layer,
        "cp_ring_step_bytes_forward": ring_fwd_step if cp > 1 else 0,
        "cp_ring_step_bytes_backward": ring_bwd_step if cp > 1 else 0,
        "cp_ring_over_attention_forward": ratio_fwd, "cp_ring_over_attention_backward": ratio_bwd,
        "cp_ring_hides": cp > 1 and max(ratio_fwd, ratio_bwd) <= 1.0,
        "cp_bytes_per_gpu": cp_bytes, "cp_link": cp_link, "cp_comm_s": cp_s, "cp_comm_exposed_overlap_s": cp_exposed,
        "grad_group": n,
        "dp_bytes_per_gpu": reduce_bytes + gather_bytes,
        "dp_reduce_bytes_per_gpu": reduce_bytes, "dp_gather_bytes_per_gpu": gather_bytes,
        "dp_link": dp_link, "compute_s": compute_s, "dp_comm_s": reduce_s + gather_s,
        "dp_comm_exposed_overlap_s": reduce_exposed + gather_exposed,
        "step_s": step_plain, "step_overlap_s": step_overlap,
        "efficiency": compute_s / step_plain, "efficiency_overlap": compute_s / step_overlap,
        "tokens_per_s_overlap": gb * seq / step_overlap,
        "mfu_overlap": flops / (a.gpus * a.peak_tflops * 1e12 * step_overlap),
        "state_bytes": st, "activation_bytes": act,
        "memory_gib": mem_gib, "fits": mem_gib <= a.gpu_mem_gib,
    }


MODES = {"dp": "DP all-reduce", "zero1": "ZeRO-1"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--tp", type=int, help="one tensor-parallel size (default: every one of 1, 2, 4, 8 that fits)")
    p.add_argument("--cp", help="context-parallel size, or 'all' for every one that divides: the layout search")
    p.add_argument("--sp", choices=["both", "on", "off"],
                   help="sequence parallelism where tp > 1 (default both): the layout search")
    p.add_argument("--all", action="store_true", help="layout search: print the layouts that do not fit too")
    p.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default: the config's)")
    p.add_argument("--global-batch", type=int, help="sequences per step (default: micro_batch_size x grad_accum_steps)")
    p.add_argument("--seq-len", type=int, help="default: the config's train.seq_len")
    p.add_argument("--recompute", choices=["none", "attention", "full"], help="default: the config's train.recompute")
    p.add_argument("--grad-dtype", choices=["fp32", "bf16"], default="fp32",
                   help="dtype of the reduced gradients (kvshift's engines accumulate fp32)")
    p.add_argument("--master", choices=["sharded", "replicated"], default="sharded",
                   help="fp32 master weights sharded by ZeRO-1 with the moments (default) or on every GPU "
                        "(kvshift's engines today)")
    p.add_argument("--mfu", type=float, default=0.45, help="achieved MFU assumed for the compute (default 0.45)")
    p.add_argument("--peak-tflops", type=float, default=989, help="peak dense bf16 TFLOP/s (H100 SXM: 989)")
    p.add_argument("--nvlink-gbs", type=float, default=900, help="NVLink GB/s per GPU within a node (default 900)")
    p.add_argument("--ib-gbps", type=float, default=400, help="InfiniBand Gb/s per GPU across nodes (default 400)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--gpu-mem-gib", type=float, default=80)
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    return p.parse_args(argv)


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def search_layouts(m, train, a):
    """Every dp x cp x tp (x SP) of --gpus that kvshift accepts and the global batch splits into;
    the others as `skipped` ({"tp", "cp", "kind", "why"})."""
    tps = [a.tp] if a.tp is not None else [t for t in (1, 2, 4, 8) if a.gpus % t == 0 and tp_error(m, t) is None]
    rows, skipped = [], []
    for tp in tps:
        cps = [a.search] if a.search != "all" else divisors(a.gpus // tp)
        for cp in cps:
            if (a.gpus // tp) % cp:
                skipped.append({"tp": tp, "cp": cp, "kind": "gpus", "why": "tp x cp does not divide --gpus"})
                continue
            why = cp_error(m, a.seq_len, cp)
            if why:
                skipped.append({"tp": tp, "cp": cp, "kind": "seq", "why": why})
                continue
            dp = a.gpus // (tp * cp)
            if a.global_batch % (dp * a.micro_batch):
                skipped.append({"tp": tp, "cp": cp, "dp": dp, "kind": "batch",
                                "why": "the global batch (%d sequences) is not a multiple of dp %d x micro-batch %d"
                                % (a.global_batch, dp, a.micro_batch)})
                continue
            sps = [False, True] if tp > 1 else [False]
            if a.sp != "both":
                sps = [s for s in sps if s == (a.sp == "on")]
            for sp in sps:
                if sp and a.seq_len % tp:
                    skipped.append({"tp": tp, "cp": cp, "kind": "sp", "why": "SP: seq_len is not divisible by tp"})
                    continue
                rows.append(predict(m, train, a, dp, cp, tp, sp, "zero1"))
    rows.sort(key=lambda r: (not r["fits"], r["step_overlap_s"]))
    return rows, skipped


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
    a.search = None
    if a.cp is not None or a.sp is not None:
        a.sp = a.sp or "both"
        if a.cp is None or a.cp == "all":
            a.search = "all"
        else:
            need(a.cp.isdigit() and int(a.cp) >= 1, "--cp must be a positive integer or 'all', got '%s'" % a.cp)
            a.search = int(a.cp)
            need(a.gpus % a.search == 0, "--cp %d does not divide --gpus %d" % (a.search, a.gpus))
            why = cp_error(m, a.seq_len, a.search)
            need(why is None, "--cp %d: %s" % (a.search, why))
        need(a.sp != "on" or a.tp != 1, "--sp on needs tp > 1")
    if a.tp is not None:
        need(a.tp >= 1 and a.gpus % a.tp == 0, "--tp %d does not divide --gpus %d" % (a.tp, a.gpus))
        why = tp_error(m, a.tp)
        need(why is None, why or "")
    skipped = []
    if a.search is None:
        tps = [a.tp] if a.tp is not None else [t for t in (1, 2, 4, 8) if a.gpus % t == 0 and tp_error(m, t) is None]
        for t in tps:
            dp = a.gpus // t
            need(a.global_batch % (dp * a.micro_batch) == 0,
                 "the global batch (%d sequences) is not a multiple of dp x micro-batch (%d x %d); "
                 "set --global-batch or --micro-batch" % (a.global_batch, dp, a.micro_batch))
        rows = [predict(m, train, a, a.gpus // t, 1, t, False, mode) for t in tps for mode in MODES]
    else:
        rows, skipped = search_layouts(m, train, a)
        first = skipped[0] if skipped else None
        need(rows, "no layout of %d GPUs splits the global batch of %d sequences and the model (%s)" %
             (a.gpus, a.global_batch, "tp %d x cp %d: %s" % (first["tp"], first["cp"], first["why"]) if first
              else "no tp in 1, 2, 4, 8 divides both --gpus and the model's heads"))
    counts = param_counts(m)
    ok = [r for r in rows if r["fits"]]
    best = max(ok, key=lambda r: r["tokens_per_s_overlap"]) if ok else None
    best_serial = max(ok, key=lambda r: r["efficiency"]) if ok else None
    return {
        "config": a.config, "name": name, "gpus": a.gpus, "gpus_per_node": a.gpus_per_node,
        "search": a.search is not None,
        "global_batch_sequences": a.global_batch, "micro_batch": a.micro_batch, "seq_len": a.seq_len,
        "tokens_per_step": a.global_batch * a.seq_len, "recompute": train["recompute"],
        "params_total": counts["total"], "params_non_embedding": counts["non_embedding"],
        "params_shift": counts["shift"], "train_flops_per_token": flops_per_token(m, a.seq_len),
        "assumptions": {"mfu": a.mfu, "peak_tflops": a.peak_tflops, "nvlink_GBps": a.nvlink_gbs,
                        "ib_Gbps_per_gpu": a.ib_gbps, "grad_dtype": a.grad_dtype, "master": a.master,
                        "gpu_mem_gib": a.gpu_mem_gib},
        "rows": rows, "skipped": skipped,
        "recommended": best and {"layout": best["layout"], "mode": best["mode"]},
        "recommended_without_overlap": best_serial and {"layout": best_serial["layout"], "mode": best_serial["mode"]},
    }


# ---- printing ----

def gb(x):
    return "%.2f" % (x / 1e9)


def mb_(x):
    return "%.1f" % (x / 1e6)


def pct(x):
    return "%.0f%%" % (100 * x)


def print_header(r):
    a = r["assumptions"]
    print("%s on %d GPUs (%d per node): %.2fB params, %.3g FLOP/token, %d x %d tokens per step (micro-batch %d), "
          "recompute %s" % (r["name"], r["gpus"], r["gpus_per_node"], r["params_total"] / 1e9,
                            r["train_flops_per_token"], r["global_batch_sequences"], r["seq_len"],
                            r["micro_batch"], r["recompute"]))
    print("assumed: MFU %.0f%% of %g TFLOP/s; NVLink %g GB/s in a node, InfiniBand %g Gb/s per GPU across nodes; "
          "%s gradients; fp32 master %s" % (100 * a["mfu"], a["peak_tflops"], a["nvlink_GBps"], a["ib_Gbps_per_gpu"],
                                            a["grad_dtype"], a["master"]))


def print_table(r):
    print_header(r)
    a = r["assumptions"]
    head = ("layout", "grad reduction", "mb/GPU", "TP GB/GPU", "DP GB/GPU", "compute s", "TP s", "DP s",
            "step s", "eff", "step s ovl", "eff ovl", "MFU ovl", "mem GiB")
    fmt = "%-14s %-14s %6s %10s %10s %9s %7s %7s %8s %5s %10s %7s %7s %9s"
    print(fmt % head)
    for x in r["rows"]:
        print(fmt % (x["layout"], MODES[x["mode"]], x["micro_batches_per_gpu"],
                     gb(x["tp_bytes_per_gpu"]) + ("" if x["tp"] == 1 else "/" + x["tp_link"][:2]),
                     gb(x["dp_bytes_per_gpu"]) + "/" + x["dp_link"][:2],
                     "%.3f" % x["compute_s"], "%.3f" % x["tp_comm_s"], "%.3f" % x["dp_comm_s"],
                     "%.3f" % x["step_s"], pct(x["efficiency"]), "%.3f" % x["step_overlap_s"],
                     pct(x["efficiency_overlap"]), "%.1f%%" % (100 * x["mfu_overlap"]),
                     "%.1f%s" % (x["memory_gib"], "" if x["fits"] else " !")))
    print("GB/GPU: bytes each GPU sends per step (/nv NVLink, /ib InfiniBand); compute includes recomputation; "
          "eff = compute / step; MFU = model FLOPs / (step x peak); "
          "ovl = reduction overlapped with the last backward, ZeRO-1's gather with the next forward; "
          "! = over %g GiB" % a["gpu_mem_gib"])
    rec = r["recommended"]
    print("fastest layout that fits: %s" % ("%s, %s" % (rec["layout"], MODES[rec["mode"]]) if rec else
                                            "none (lower the micro-batch, recompute, or raise tp)"))


def describe_tp(x):
    c = x["tp_collectives_per_layer"]
    if not c:
        return "-"
    where = x["tp_link"][:2]
    if "all_reduce" in c:
        return "%d AR x %s MB %s" % (c["all_reduce"], mb_(x["tp_buffer_bytes"]), where)
    return "%d AG + %d RS x %s MB %s" % (c["all_gather"], c["reduce_scatter"], mb_(x["tp_buffer_bytes"]), where)


def describe_ring(x, recompute):
    if x["cp"] == 1:
        return "-", "-", "-"
    cp, fwd = x["cp"], 1 + (recompute != "none")
    ring = "%s%d x %s + %d x %s MB %s" % ("%d x " % fwd if fwd > 1 else "", cp - 1,
                                          mb_(x["cp_ring_step_bytes_forward"]), cp,
                                          mb_(x["cp_ring_step_bytes_backward"]), x["cp_link"][:2])
    ratio = "%.2f / %.2f %s" % (x["cp_ring_over_attention_forward"], x["cp_ring_over_attention_backward"],
                                "hides" if x["cp_ring_hides"] else "EXPOSED")
    return ring, ratio, "%.1f KB" % (x["cp_halo_bytes_per_layer"] / 1e3)


def print_search(r, show_all):
    print_header(r)
    a = r["assumptions"]
    rows = [x for x in r["rows"] if x["fits"] or show_all]
    hidden = len(r["rows"]) - len(rows)
    print("\ncommunication of each GPU, per layer and micro-batch (AR all-reduce, AG all-gather, RS reduce-scatter "
          "of the buffer shown; ring: forward steps x bytes + backward steps x bytes), and per step for the gradients:")
    fmt = "%-26s %-26s %-30s %-22s %-10s %s"
    print(fmt % ("layout", "TP / SP per layer", "CP ring per layer", "ring/attention f / b", "halo/layer",
                 "grads over dp x cp: RS + AG per step"))
    for x in rows:
        ring, ratio, halo = describe_ring(x, r["recompute"])
        print(fmt % (x["layout"], describe_tp(x), ring, ratio, halo,
                     "%s + %s GB %s (%d ranks)" % (gb(x["dp_reduce_bytes_per_gpu"]), gb(x["dp_gather_bytes_per_gpu"]),
                                                   x["dp_link"][:2], x["grad_group"])))
    print("\nstep time and memory per GPU (ZeRO-1 over dp x cp):")
    head = ("layout", "mb/GPU", "TP GB", "CP GB", "DP GB", "compute s", "TP s", "CP s", "DP s", "step s", "eff",
            "step ovl", "eff ovl", "MFU ovl", "act GiB", "mem GiB")
    fmt = "%-26s %6s %7s %7s %7s %9s %6s %6s %6s %7s %4s %8s %7s %7s %7s %8s"
    print(fmt % head)
    for x in rows:
        print(fmt % (x["layout"], x["micro_batches_per_gpu"], gb(x["tp_bytes_per_gpu"]), gb(x["cp_bytes_per_gpu"]),
                     gb(x["dp_bytes_per_gpu"]), "%.3f" % x["compute_s"], "%.3f" % x["tp_comm_s"],
                     "%.3f" % x["cp_comm_s"], "%.3f" % x["dp_comm_s"], "%.3f" % x["step_s"], pct(x["efficiency"]),
                     "%.3f" % x["step_overlap_s"], pct(x["efficiency_overlap"]), "%.1f%%" % (100 * x["mfu_overlap"]),
                     "%.1f" % (x["activation_bytes"]["total"] / 2**30),
                     "%.1f%s" % (x["memory_gib"], "" if x["fits"] else " !")))
    print("GB: bytes each GPU sends per step; ovl: the ring hidden behind attention as far as it can be, the gradient "
          "reduce-scatter behind the last backward and the all-gather behind the next forward; TP is never hidden; "
          "! = over %g GiB" % a["gpu_mem_gib"])
    if hidden:
        print("%d more layouts do not fit in %g GiB (--all shows them)" % (hidden, a["gpu_mem_gib"]))
    # The layouts kvshift or the batch rule out, one line per reason.
    skipped = r["skipped"]
    seq = sorted({s["cp"] for s in skipped if s["kind"] == "seq"})
    if seq:
        print("not possible: cp %s (seq_len %d is not divisible by 2 x cp)" % (", ".join(map(str, seq)), r["seq_len"]))
    dps = sorted({s["dp"] for s in skipped if s["kind"] == "batch"}, reverse=True)
    if dps:
        print("not possible: dp %s (the global batch of %d sequences is not a multiple of dp x micro-batch %d)"
              % (", ".join(map(str, dps)), r["global_batch_sequences"], r["micro_batch"]))
    for s in skipped:
        if s["kind"] not in ("seq", "batch"):
            print("not possible: tp %d x cp %d: %s" % (s["tp"], s["cp"], s["why"]))
    rec, ser = r["recommended"], r["recommended_without_overlap"]
    print("fastest layout that fits: %s" % (rec["layout"] if rec else
                                            "none (lower the micro-batch, recompute, or raise cp or tp)"))
    if rec and ser and ser["layout"] != rec["layout"]:
        print("fastest without overlap: %s" % ser["layout"])


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
    elif r["search"]:
        print_search(r, args.all)
    else:
        print_table(r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
