#!/usr/bin/python3
"""Scaling on paper: bytes each GPU sends per step, predicted step time, scaling
efficiency and memory per GPU of a kvshift config under DP, ZeRO-1, TP, sequence
parallelism (SP), context parallelism (CP) and pipeline parallelism (PP).

    scripts/scaling.py --config configs/paper/19B-kvshift.json --gpus 240 [--tp 4]
        [--micro-batch B] [--global-batch SEQS] [--seq-len T] [--recompute none|attention|full]
        [--grad-dtype fp32|bf16] [--master sharded|replicated] [--mfu 0.45] [--peak-tflops 989]
        [--nvlink-gbs 450] [--ib-gbps 400] [--nccl-base-latency-us 8.4] [--nvlink-latency-us 3.4]
        [--ib-latency-us 14] [--gpus-per-node 8] [--gpu-mem-gib 80] [--json]
    scripts/scaling.py --config configs/paper/19B-kvshift.json --gpus 256 --seq-len 32768 --global-batch 96
        --cp all|N [--sp both|on|off] [--tp N] [--pp all|N] [--virtual-stages all|N]
        [--p2p-dtype bf16|fp32] [--all] ...
    scripts/scaling.py --config configs/paper/19B-kvshift.json --recommend [--gpus 8,16,64,256,1024] ...

Without --cp, --sp, --pp and --virtual-stages: the DP/ZeRO-1 x TP table, every
tp in 1, 2, 4, 8 that the model and --gpus allow (or --tp), each with plain DP
and ZeRO-1. With --cp, --sp, --pp or --virtual-stages: the layout search, every
dp x pp x cp x tp (x virtual stages, x SP on/off where tp > 1) with ZeRO-1
over each stage's dp x cp, the communication of each per layer, and the ones
that fit in --gpu-mem-gib sorted by predicted step time (--all: the others
too). --recommend: the full search for each GPU count, the fastest layout with
and without pipeline parallelism.
Every collective and send costs its bytes over the link plus NCCL's own latency
for it (the Ring/Simple constants of NCCL's tuning model, src/graph/tuning.cc;
--nccl-base-latency-us, --nvlink-latency-us, --ib-latency-us).
The model, its assumptions and worked examples are in docs/scaling.md.
Standard library only, so it runs before anything is built. Errors are one
line, `scaling: error: ...`, exit 1.
"""

import argparse
import copy
import json
import math
import sys

# The config keys this tool reads, with kvshift's defaults (docs/CONFIG.md), except
# train.micro_batch_size and seq_len: kvshift's are 8 and 128, these 1 and 1024 are the tool's own.
MODEL_DEFAULTS = {"tie_word_embeddings": False, "document_boundaries": "none", "kv_shift": {}}
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
    need(isinstance(cfg, dict) and isinstance(cfg.get("model"), dict), "%s: no 'model' object" % path)
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


def cuda_activations(m, tp, micro_batch, seq_len, recompute, sp=False, cp=1, stage=None):
    """Bytes of the CUDA engine's activations and workspaces on one GPU, by group.

    CudaPlan::build (src/model/cuda_engine.cpp) written again buffer by buffer: its arena without the
    parameters (fp32 gradients, bf16 copy; the fp32 master is allocated apart), plus the cuBLASLt
    workspace, which is kvshift info's memory_bytes_cuda.activations_and_workspaces (and, per
    pipeline stage, its pipeline_stages entry) to the byte, in every layout (tests/test_scaling.py):
    - SP: the residual stream (layer inputs, res_mid, the RMSNorm outputs and rstd, the final norm,
      the attention and FFN output projections' result, dresid, dln) holds N/tp rows, plus two [N, C]
      buffers for the gathered or not-yet-scattered rows and one layer's two norm gains' fp32
      gradients [2, C] (sp_full, sp_full2, norm_grads);
    - CP: every per-token buffer holds the rank's B*T/cp rows (flash attention: no T x T term), plus
      the ring: the K/V block in hand and the one arriving, each [rows, 2 KD] bf16 with its dK/dV
      fp32 accumulators, an fp32 [rows, QD] accumulator for the merged output (and dq), one
      chunk's partial output, log-sum-exp, dK and dV, and the halo (W rows of every q/k/v column per
      chunk: the rank's own tails, every rank's halos, and their fp32 gradients).
    Groups: residual_stream (divided by tp under SP), per_token (the other buffers with one row per
    token), sp_buffers, cp_ring, workspace (kernel scratch, batch inputs, shift coefficients, RoPE
    tables, AdamW chunk tables, cuBLASLt); total.

    `stage` (pipeline parallelism; None: the whole model) is one rank's part: {"layers": its layers,
    "runs": its runs of consecutive layers (its virtual stages), "head": whether it holds the final
    norm and LM head, "slots": micro-batches its schedule keeps in flight, "tensors": its TP-local
    tensor sizes}. As CudaPlan does, what a micro-batch keeps from its forward to its backward (the
    layer inputs, one more per run, the kept activations, the logits, the batch) is held once per
    slot; the rest (the recomputed layers' buffers, the backward's, the workspaces) once, plus a
    staged rank's input gradient for the previous stage and the discarded rstd of a chunk's last
    residual add.
    """
    L, C = m["num_hidden_layers"], m["hidden_size"]
    head, slots, tensors, runs, staged = True, 1, None, 1, False
    if stage is not None:
        L, head, slots, tensors = stage["layers"], stage["head"], stage["slots"], stage["tensors"]
        runs, staged = stage["runs"], True
    D = C // m["num_attention_heads"]
    Hq, Hkv, F = m["num_attention_heads"] // tp, m["num_key_value_heads"] // tp, m["intermediate_size"] // tp
    V = padded_vocab(m, tp) // tp
    QD, KD = Hq * D, Hkv * D
    W = m["kv_shift"]["window"]
    W1 = W + 1
    B, T = micro_batch, seq_len
    N = B * T // cp  # this rank's rows (CP: two chunks of T / 2cp of every sequence)
    Nl = N // tp if sp else N  # the residual stream's rows under SP
    A = L if recompute == "none" else 1  # layers of attention outputs kept
    R = 1 if recompute == "full" else L  # layers of the other activations kept
    attn_kept, rest_kept = recompute == "none", recompute != "full"
    h2, f4 = BF16, FP32
    g = {"residual_stream": 0, "per_token": 0, "sp_buffers": 0, "cp_ring": 0, "workspace": 0}

    def take(group, nbytes):
        g[group] += align256(nbytes)

    def per_slot(group, nbytes):
        g[group] += slots * align256(nbytes)

    def kept_group(group, count, stride, kept):
        (per_slot if kept else take)(group, count * stride)

    res, rstd = align256(Nl * C * h2), align256(Nl * f4)
    per_slot("residual_stream", (L + runs) * res)  # layer inputs: always kept
    for _ in range(3):  # res_mid, ln1, ln2
        kept_group("residual_stream", R, res, rest_kept)
    kept_group("per_token", R, align256(N * (QD + 2 * KD) * h2), rest_kept)  # qkv
    kept_group("per_token", A, align256(N * QD * h2), attn_kept)             # qhat
    kept_group("per_token", A, align256(N * KD * h2), attn_kept)             # khat
    kept_group("per_token", A, align256(N * KD * h2), attn_kept)             # vhat
    kept_group("per_token", A, align256(N * QD * h2), attn_kept)             # attout
    kept_group("per_token", R, align256(N * 2 * F * h2), rest_kept)          # gate_up
    kept_group("per_token", R, align256(N * F * h2), rest_kept)              # h
    kept_group("residual_stream", R, rstd, rest_kept)                        # rstd1
    kept_group("residual_stream", R, rstd, rest_kept)                        # rstd2
    kept_group("per_token", A, align256(B * Hq * (T // cp) * f4), attn_kept)  # lse
    per_slot("residual_stream", head * Nl * C * h2)  # lnf
    per_slot("residual_stream", head * Nl * f4)      # rstdf
    per_slot("per_token", head * N * V * h2)         # logits
    per_slot("per_token", head * N * f4)             # losses
    take("residual_stream", Nl * C * h2 if staged else 0)  # dstage: the input gradient for the previous stage
    take("residual_stream", Nl * f4 if staged else 0)      # stage_rstd: a chunk's last residual add's, discarded
    take("residual_stream", Nl * C * h2)                   # proj: an output projection's result
    coef = align256((Hq + 2 * Hkv) * W1 * f4)
    take("workspace", L * coef)                      # shift coefficients
    take("workspace", T * D // 2 * f4)               # RoPE cos
    take("workspace", T * D // 2 * f4)               # RoPE sin
    take("residual_stream", Nl * C * h2)             # dresid
    take("residual_stream", Nl * C * h2)             # dln
    if sp:
        take("sp_buffers", N * C * h2)               # sp_full
        take("sp_buffers", N * C * h2)               # sp_full2
        take("sp_buffers", 2 * C * f4)               # norm_grads: one layer's two gains
    if cp > 1:
        Tc, Rh, QKV = T // (2 * cp), 2 * B * W, QD + 2 * KD
        kv = 2 * B * Tc * KD                         # one of k, v, dk, dv: both chunks
        take("cp_ring", Rh * QKV * h2)               # tails
        take("cp_ring", cp * Rh * QKV * h2)          # halos of every rank
        take("cp_ring", Rh * QKV * f4)               # dtails
        take("cp_ring", cp * Rh * QKV * f4)          # dhalos
        take("cp_ring", 2 * kv * h2 + 2 * kv * f4)   # the K/V block in hand, with its dK/dV
        take("cp_ring", 2 * kv * h2 + 2 * kv * f4)   # and the one arriving
        take("cp_ring", N * QD * f4)                 # merged output (forward), dq (backward)
        take("cp_ring", B * Tc * QD * h2)            # one chunk's partial output
        take("cp_ring", B * Hq * Tc * f4)            # and its log-sum-exp
        take("cp_ring", B * Tc * KD * h2)            # dK
        take("cp_ring", B * Tc * KD * h2)            # dV
    for nbytes in (N * F * h2, N * 2 * F * h2, N * QD * h2, N * QD * h2, N * KD * h2, N * KD * h2,
                   N * (QD + 2 * KD) * h2):          # dh, dgate_up, dattout, dqhat, dkhat, dvhat, dqkv
        take("per_token", nbytes)
    take("workspace", (Hq + 2 * Hkv) * W1 * f4)     # dcoef
    # Kernel scratch: the largest of the RMSNorm, shift+RoPE and attention backwards' (sized by
    # CudaPlan for all N rows and the whole sequence, whatever SP and CP).
    scratch = max(rmsnorm_backward_scratch_floats(N, C), shift_rope_backward_scratch_floats(B, T, Hq, D, W),
                  shift_rope_backward_scratch_floats(B, T, Hkv, D, W), B * Hq * T, 1)
    take("workspace", scratch * f4)
    take("workspace", 1024 * 8)  # fp64 reduction scratch (kSumBlocks doubles)
    take("workspace", 8)
    for nbytes in (N * 4, N * 4, N * f4) + ((N * 4,) if m["document_boundaries"] != "none" else ()):
        per_slot("workspace", nbytes)  # tokens, targets, mask (and document starts)
    for nbytes in (N * 4, (N + 1) * 4, N * 4, N * 4):  # embedding's unique ids, offsets, positions; argmax
        take("workspace", nbytes)
    if tp > 1:
        take("workspace", 6 * N * f4)  # vocab-parallel loss statistics
    tensors = tensors if tensors is not None else local_tensors(m, tp)
    chunks = sum(math.ceil(n / (1 << 16)) for n in tensors)
    take("workspace", chunks * 24)  # AdamWChunk {u64, u64, u32}: 24 bytes
    take("workspace", chunks * 24)
    P = sum(tensors)  # the fp32 gradients and bf16 copy are aligned too: the padding counts here
    g["workspace"] += align256(P * f4) - P * f4 + align256(P * h2) - P * h2
    g["workspace"] += CUBLAS_WORKSPACE
    g["total"] = sum(g.values())
    return g


def state_bytes(p_gpu, grad_bytes, master, shards):
    """Parameters, gradients and optimizer state of one GPU: bf16 copy, gradients, and either
    the fp32 master with the two fp32 AdamW moments sharded over `shards` ranks (master "sharded",
    Megatron's distributed optimizer, and kvshift's CUDA engine with train.shard_master) or the fp32
    master on every GPU and only the moments sharded (master "replicated": train.shard_master false,
    or the CPU engine)."""
    if master == "sharded":
        return (BF16 + grad_bytes) * p_gpu + 12 * p_gpu / shards
    return (BF16 + grad_bytes + FP32) * p_gpu + 8 * p_gpu / shards


# ---- pipeline parallelism (src/parallel/pipeline.cpp, pipeline_schedule.cpp) ----

def pp_error(m, pp, v, micro_batches):
    """Why kvshift refuses pp stages of v virtual stages over this many micro-batches per replica
    (config.cpp, pipeline.cpp, train_step.cpp), or None. The tool splits the layers evenly."""
    L = m["num_hidden_layers"]
    if v > 1 and pp == 1:
        return "virtual stages %d: interleaving needs pp > 1" % v
    if L % (pp * v):
        return "pp x virtual stages (%d x %d) does not divide the %d layers" % (pp, v, L)
    if v > 1 and micro_batches % pp:
        return "interleaving needs the micro-batches per replica (%d) to be a multiple of pp %d" % (micro_batches, pp)
    return None


def pipeline_schedule(pp, v, rank, m):
    """Rank `rank`'s passes over m micro-batches, in order: ("F" or "B", micro-batch, chunk), as
    pipeline_schedule() in src/parallel/pipeline_schedule.cpp builds them (1F1B; Megatron's
    interleaved 1F1B for v > 1, m a multiple of pp)."""
    if v == 1:
        warm = min(pp - rank - 1, m)
        ops = [("F", i, 0) for i in range(warm)]
        for i in range(m - warm):
            ops += [("F", warm + i, 0), ("B", i, 0)]
        return ops + [("B", i, 0) for i in range(m - warm, m)]
    total, group = m * v, pp * v
    fwd = [("F", k // group * pp + k % pp, k % group // pp) for k in range(total)]
    bwd = [("B", mb, v - 1 - c) for _, mb, c in fwd]
    warm = total if m == pp else min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    ops = fwd[:warm]
    for k in range(total - warm):
        ops += [fwd[warm + k], bwd[k]]
    return ops + bwd[total - warm:]


_in_flight = {}


def micro_batches_in_flight(pp, v, rank, m):
    """The most micro-batches rank's schedule has forwarded and not yet finished backwarding: the
    activation slots the engine allocates (micro_batches_in_flight(), `kvshift info`'s pipeline_stages).
    1F1B: min(pp - rank, m)."""
    key = (pp, v, rank, m)
    if key not in _in_flight:
        active, most = set(), 0
        for kind, mb, chunk in pipeline_schedule(pp, v, rank, m):
            if kind == "F":
                active.add(mb)
            most = max(most, len(active))
            if kind == "B" and chunk == 0:
                active.discard(mb)
        _in_flight[key] = max(most, 1)
    return _in_flight[key]


def chunk_passes_in_flight(pp, v, rank, m):
    """The most chunk passes (one micro-batch through one chunk) forwarded and not yet backwarded:
    what a stage would hold if it freed each chunk's activations after that chunk's backward
    (Megatron). Rank 0: pp + (pp - 1) / v stages' worth, i.e. pp v + pp - 1 chunks, for m > pp."""
    active, most = 0, 0
    for kind, _, _ in pipeline_schedule(pp, v, rank, m):
        active += 1 if kind == "F" else -1
        most = max(most, active)
    return most


def stage_tensors(m, tp, pp, v, rank):
    """TP-local sizes of pipeline rank `rank`'s tensors: its L/pp layers (even split into pp x v
    stages), the embedding on rank 0, the final norm and LM head on rank pp - 1 (with tied embeddings
    the last stage's own copy of the embedding is its head). pp 1: the whole model."""
    t = local_tensors(m, tp)
    L = m["num_hidden_layers"]
    per_layer = (len(t) - 2 - (not m["tie_word_embeddings"])) // L
    layers = t[1:1 + L * per_layer]
    head_tensors = t[1 + L * per_layer:]  # final norm (+ untied LM head)
    if pp == 1:
        return t
    out = [t[0]] if rank == 0 else []
    out += layers[:L // pp * per_layer]  # every rank holds L / pp layers of the same shapes
    if rank == pp - 1:
        out += head_tensors + ([t[0]] if m["tie_word_embeddings"] else [])
    return out


def stage_flops_per_token(m, seq_len, layers, head):
    """Training FLOPs per token of `layers` decoder layers (+ the final norm and LM head): the terms
    of flops_per_token() that belong to them, so the stages sum to the whole model."""
    L, h = m["num_hidden_layers"], m["hidden_size"]
    per_layer = 6 * (param_counts(m)["non_embedding"] - h) / L + 6 * seq_len * h
    return layers * per_layer + (6 * h + 6 * m["vocab_size"] * h if head else 0)


def stage_tp_collectives(layers, first, last, recompute, sp):
    """tp_collectives() of one pipeline stage: its layers' share; the embedding's once-collectives on
    the first stage, the LM head's on the last."""
    full = recompute == "full"
    if not sp:
        return {"all_reduce": (4 + 2 * full) * layers + first + last}
    return {"all_gather": (6 + 2 * full) * layers + first + 2 * last,
            "reduce_scatter": (4 + 2 * full) * layers + first + last}


def node_of(rank, a):
    return rank // a.gpus_per_node


def pp_boundary_links(dp, pp, cp, tp, a):
    """The link of each stage boundary r -> r + 1 (and, interleaved, the wrap-around pp - 1 -> 0):
    InfiniBand if, in any replica, a rank and its neighbour (the same dp, cp and tp rank) sit in
    different nodes. Rank = ((dp_rank pp + pp_rank) cp + cp_rank) tp + tp_rank (docs/PARALLEL.md)."""
    block = cp * tp

    def crosses(r0, r1):
        return any(node_of((d * pp + r0) * block + i, a) != node_of((d * pp + r1) * block + i, a)
                   for d in range(dp) for i in range(block))
    return {"forward": ["ib" if crosses(r, r + 1) else "nvlink" for r in range(pp - 1)],
            "wrap": "ib" if pp > 1 and crosses(pp - 1, 0) else "nvlink"}


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
    """One GPU's one-way rate on a link: what a point-to-point send (the CP ring, the pipeline's
    sends) gets; across nodes, the GPU's own NIC."""
    return a.nvlink_gbs * 1e9 if kind == "nvlink" else a.ib_gbps / 8 * 1e9


def ring_link(groups, a):
    """The link of ring collectives over each group of ranks (the slowest group counts): ("nvlink", 1, 1)
    when every group sits in one node, else ("ib", k, nodes), k the fewest members of a group in one
    node (the node whose NICs carry the most of the ring's traffic each), nodes the most nodes a group
    spans (what NCCL's latency counts: nccl_ring_latency_us)."""
    k, nodes = a.gpus_per_node, 1
    for ranks in groups:
        per_node = {}
        for r in ranks:
            per_node[node_of(r, a)] = per_node.get(node_of(r, a), 0) + 1
        nodes = max(nodes, len(per_node))
        k = min(k, min(per_node.values()))
    return ("ib", k, nodes) if nodes > 1 else ("nvlink", 1, 1)


# ---- latency: NCCL's own tuning model ----
#
# NCCL (NVIDIA/nccl, src/graph/tuning.cc, version 2.30.7, commit 5067397c2676d5aed50042fc39e5c8ee96eb0027)
# predicts a collective's time as latency + bytes / bandwidth (ncclTopoGetAlgoTime). For the Ring
# algorithm and the Simple protocol (what it picks for large buffers) its default tuner constants are
# baseLatencies[Ring][Simple] = 8.4 us, and per ring step hwLatencies[NVLINK][Ring][Simple] = 3.4 us,
# hwLatencies[NET][Ring][Simple] = 14.0 us (and [NET][Tree][Simple] = 14, which it uses when every node
# holds one rank: the same). ncclTopoTuneModel: a ring all-reduce of n ranks on N nodes takes
# nsteps = 2(n - 1) steps of which nInterSteps = 2(N - 1) cross nodes; a reduce-scatter or all-gather
# n - 1 and N - 1; latency = base + (nsteps - nInterSteps) x intra + nInterSteps x inter. Across nodes
# intra is max(3.4, 3 x the net overhead of 1.0 us) = 3.4, and inter adds the net plugin's latency,
# which the InfiniBand plugin leaves at 0. ncclTopoGetAlgoTime multiplies a Ring/Simple all-reduce
# across nodes by 1.4 on Ampere and later ("plateau effect of ring"; 1.9 before), for any buffer of
# at least 64 bytes per channel and rank. NCCL has no latency model for send/receive: a send to a
# neighbour with its receive is the one step of a 2-rank ring all-gather, base + one hop's hwLatency.
NCCL_RING_PLATEAU = 1.4


def nccl_ring_latency_us(coll, n, nodes, a):
    """NCCL's Ring/Simple latency (us) of one all_reduce, reduce_scatter or all_gather over n ranks
    spanning `nodes` nodes (tuning.cc, above)."""
    if n <= 1:
        return 0.0
    steps = 2 * (n - 1) if coll == "all_reduce" else n - 1
    inter = 0 if nodes <= 1 else (2 * (nodes - 1) if coll == "all_reduce" else nodes - 1)
    lat = a.nccl_base_latency_us + (steps - inter) * a.nvlink_latency_us + inter * a.ib_latency_us
    return lat * NCCL_RING_PLATEAU if coll == "all_reduce" and nodes > 1 else lat


def p2p_latency_us(kind, a):
    """A send to a neighbour and its receive on `kind` ("nvlink" or "ib"): one ring step, base + hop."""
    return a.nccl_base_latency_us + (a.nvlink_latency_us if kind == "nvlink" else a.ib_latency_us)


def ring_bandwidth(kind, k, a):
    """One rank's rate in a ring all-reduce, reduce-scatter or all-gather (its 2(n-1)/n or (n-1)/n of
    the buffer over this is the time). In one node, NVLink. Across nodes NCCL runs a ring (channel)
    per NIC, each leaving the node through another member's NIC: of what a member sends, 1/k goes out
    through its own NIC and (k-1)/k over NVLink to the member whose NIC the next channel uses. The
    slower of the two sets the pace: k NICs in parallel until NVLink is the limit."""
    if kind == "nvlink":
        return bandwidth("nvlink", a)
    return 1.0 / max(1.0 / (k * bandwidth("ib", a)), (k - 1.0) / (k * bandwidth("nvlink", a)))


def tp_groups(gpus, tp):
    return [range(g, g + tp) for g in range(0, gpus, tp)]


def cp_groups(dp, pp, cp, tp):
    """The cp ranks of each (dp, pipeline, tp) rank that run one sequence's ring and halo together."""
    return [[((d * pp + p) * cp + c) * tp + t for c in range(cp)]
            for d in range(dp) for p in range(pp) for t in range(tp)]


def gradient_groups(dp, pp, cp, tp):
    """The dp x cp ranks of each (pipeline rank, tp rank) that hold the same weights and sum their
    gradients. Rank = ((dp_rank pp + pp_rank) cp + cp_rank) tp + tp_rank (docs/PARALLEL.md)."""
    return [[((d * pp + p) * cp + c) * tp + t for d in range(dp) for c in range(cp)]
            for p in range(pp) for t in range(tp)]


def predict(m, train, a, dp, cp, tp, sp, mode, pp=1, v=1):
    """One layout: dp x pp x cp x tp (SP on or off; v virtual stages per pipeline rank), gradient
    reduction `mode` over the dp x cp ranks of each stage."""
    mb, seq, gb = a.micro_batch, a.seq_len, a.global_batch
    micro_steps = gb // (dp * mb)  # micro-batches each GPU runs per step (a PP x CP x TP group shares one)
    L, h = m["num_hidden_layers"], m["hidden_size"]
    Ls = L // pp  # layers of one pipeline rank
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

    # TP (or SP): collectives of [rows, h] bf16 per micro-batch, on the critical path; a pipeline
    # rank runs its layers' (and the embedding's or the LM head's) share. Each pays NCCL's ring
    # latency over the tp ranks and the nodes they span (nccl_ring_latency_us).
    tp_buf = rows * h * BF16

    def tp_bytes_of(coll):
        return (coll.get("all_reduce", 0) * ring_allreduce_bytes(tp_buf, tp) +
                (coll.get("all_gather", 0) + coll.get("reduce_scatter", 0)) * ring_half_bytes(tp_buf, tp))
    tp_link, tp_nics, tp_nodes = ring_link(tp_groups(dp * pp * cp * tp, tp), a)
    tp_bw = ring_bandwidth(tp_link, tp_nics, a)
    tp_lat = {c: nccl_ring_latency_us(c, tp, tp_nodes, a) * 1e-6 for c in ("all_reduce", "all_gather", "reduce_scatter")}

    def tp_latency_of(coll):
        return sum(k * tp_lat[c] for c, k in coll.items())

    # CP: per layer and micro-batch the ring passes this rank's K/V block [rows, 2 KD/tp] bf16 cp - 1
    # times forward, and cp times backward with its fp32 dK/dV accumulators; the halo all-gathers W raw
    # rows of k, v (and q) per chunk forward and their gradients backward. Recomputing attention
    # repeats the forward ring and halo. The ring can hide behind the attention of the block in hand:
    # one step's attention is 1/cp of the rank's causal attention (2 T^2 d_head n_heads / (tp cp)
    # FLOPs per sequence forward, twice that backward), at the assumed MFU.
    # Latency (the CUDA engine's NCCL calls, src/model/cuda_engine_cp.cpp): a forward step is one
    # send/receive pair, a backward step two (the block, then its dK/dV); a layer gathers the halo once
    # per forward pass and twice in the backward (the halo again, then its gradients), each a ring
    # all-gather over the cp ranks.
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
    attn_step_fwd = 2.0 * mb * seq * seq * d_head * m["num_attention_heads"] / (tp * cp * cp) / achieved
    cp_nodes = ring_link(cp_groups(dp, pp, cp, tp), a)[2] if cp > 1 else 1
    cp_step_lat = p2p_latency_us(cp_link, a) * 1e-6 if cp > 1 else 0.0
    halo_lat = nccl_ring_latency_us("all_gather", cp, cp_nodes, a) * 1e-6
    halo_gathers = fwd_rings + 2 if cp > 1 and halo_piece > 0 else 0
    fwd_step_s = ring_fwd_step / cp_bw + cp_step_lat  # one ring step's transfer, latency included
    bwd_step_s = ring_bwd_step / cp_bw + 2 * cp_step_lat
    ring_layer_s = fwd_rings * (cp - 1) * fwd_step_s + cp * bwd_step_s if cp > 1 else 0.0
    halo_layer_s = halo_layer / cp_bw + halo_gathers * halo_lat
    cp_lat_layer = (fwd_rings * (cp - 1) + 2 * cp) * cp_step_lat + halo_gathers * halo_lat if cp > 1 else 0.0
    if cp > 1:
        ratio_fwd = fwd_step_s / attn_step_fwd
        ratio_bwd = bwd_step_s / (2 * attn_step_fwd)
        exposed_layer = (fwd_rings * (cp - 1) * max(0.0, fwd_step_s - attn_step_fwd) +
                         cp * max(0.0, bwd_step_s - 2 * attn_step_fwd))
    else:
        ratio_fwd = ratio_bwd = exposed_layer = 0.0

    # One micro-batch through each pipeline rank's part: compute (its FLOPs, recomputation included),
    # TP and CP, serial and with the ring overlapped. pp 1: the whole model, compute_s / micro_steps.
    extra_layer = extra[recompute] / L
    stages = []
    for r in range(pp):
        first, last = r == 0, r == pp - 1
        sf = stage_flops_per_token(m, seq, Ls, last) + extra_layer * Ls
        coll = stage_tp_collectives(Ls, first, last, recompute, sp)
        tp_r = tp_bytes_of(coll) / tp_bw + tp_latency_of(coll)
        cp_bytes_r = Ls * (ring_layer + halo_layer)
        stages.append({"compute": sf * mb * seq / (tp * cp * achieved), "tp_bytes": tp_bytes_of(coll), "tp": tp_r,
                       "tp_lat": tp_latency_of(coll), "cp_bytes": cp_bytes_r, "cp": Ls * (ring_layer_s + halo_layer_s),
                       "cp_lat": Ls * cp_lat_layer, "cp_exposed": Ls * (exposed_layer + halo_layer_s), "coll": coll})
    slow = max(stages, key=lambda x: x["compute"] + x["tp"] + x["cp"])
    slow_ovl = max(stages, key=lambda x: x["compute"] + x["tp"] + x["cp_exposed"])
    tp_bytes = micro_steps * slow["tp_bytes"]
    tp_s = micro_steps * slow["tp"]
    cp_bytes = micro_steps * slow["cp_bytes"]
    cp_s = micro_steps * slow["cp"]
    cp_exposed = micro_steps * slow_ovl["cp_exposed"]
    # The stages are not equal (the LM head is on the last): the slowest sets the pace.
    imbalance = micro_steps * slow["compute"] - compute_s if pp > 1 else 0.0
    imbalance_ovl = micro_steps * slow_ovl["compute"] - compute_s if pp > 1 else 0.0
    tp_ovl_s = micro_steps * slow_ovl["tp"]
    tp_lat_s, cp_lat_s = micro_steps * slow["tp_lat"], micro_steps * slow["cp_lat"]

    # The pipeline: the bubble is (pp - 1) / (m v) of the ideal step m x t, t the slowest rank's time
    # for one micro-batch (1F1B and interleaved alike; tests/test_scaling.py counts it on the engine's
    # schedule). P2P: each chunk pass sends its output forward ([rows, h], rows / tp under SP; bf16,
    # or fp32 as the CPU engine sends today) and its input gradient backward. Serial (a pass waits
    # for its send): every pass pays c, 2 c (m v + pp - 1) per step. Overlapped (isend while the next
    # pass computes): 1F1B stalls on the round trip, 2 c ((pp - 1) m / pp + pp - 1); interleaved only
    # on the fill and drain, 2 c (pp v - 1) (the test bounds both against the simulated schedule).
    p2p_msg = (rows // tp if sp else rows) * h * (BF16 if a.p2p_dtype == "bf16" else FP32)
    if pp > 1:
        links = pp_boundary_links(dp, pp, cp, tp, a)
        used = links["forward"] + ([links["wrap"]] if v > 1 else [])
        p2p_link = "ib" if "ib" in used else "nvlink"
        p2p_lat = p2p_latency_us(p2p_link, a) * 1e-6  # every send pays one step's latency
        c = p2p_msg / bandwidth(p2p_link, a) + p2p_lat
        pass_s = (slow["compute"] + slow["tp"] + slow["cp"]) / v
        pass_ovl_s = (slow_ovl["compute"] + slow_ovl["tp"] + slow_ovl["cp_exposed"]) / v
        bubble = (pp - 1) * pass_s
        bubble_ovl = (pp - 1) * pass_ovl_s
        p2p_s = 2 * c * (micro_steps * v + pp - 1)
        p2p_lat_s = 2 * p2p_lat * (micro_steps * v + pp - 1)
        hops = (pp - 1) * micro_steps / pp + pp - 1 if v == 1 else pp * v - 1
        # The overlap formulas hold while a transfer is short next to a chunk's forward (a third of
        # its pass); past that the tool charges the serial time.
        p2p_exposed = 2 * c * hops if c <= pass_ovl_s / 3 / 2 else p2p_s
        sends = 2 * v if pp > 2 else 2 * v - 1  # the busiest rank's: no send forward from the last stage, back from the first
        p2p_bytes = micro_steps * sends * p2p_msg
    else:
        links, p2p_link, c, p2p_lat = {"forward": [], "wrap": "nvlink"}, "-", 0.0, 0.0
        bubble = bubble_ovl = p2p_s = p2p_exposed = p2p_bytes = p2p_lat_s = 0.0

    # Gradients: summed over the dp x cp ranks holding the same weights (CP ranks each compute a share
    # of every sequence's gradient), once per step, each stage over its own ranks; ZeRO-1
    # reduce-scatters them and all-gathers the updated parameters (bf16, or the fp32 master that
    # kvshift's engines gather when it is replicated). The largest stage counts. In buckets, as the
    # overlap below assumes and the CUDA engine reduces them (cuda_engine.cpp, buckets_): one per
    # layer, one for the embedding, one for the final norm and LM head (a stage: its layers, and the
    # embedding or head it holds); each bucket is one collective (plain DP: an all-reduce; ZeRO-1: a
    # reduce-scatter and an all-gather) and pays NCCL's ring latency over the n ranks.
    n = dp * cp
    tensors = [stage_tensors(m, tp, pp, v, r) for r in range(pp)]
    params = [sum(t) for t in tensors]
    p_gpu = max(params)
    gbytes = FP32 if a.grad_dtype == "fp32" else BF16
    if mode == "zero1":
        reduce_bytes = ring_half_bytes(p_gpu * gbytes, n)
        gather_bytes = ring_half_bytes(p_gpu * (BF16 if a.master == "sharded" else FP32), n)
    else:
        reduce_bytes, gather_bytes = ring_allreduce_bytes(p_gpu * gbytes, n), 0.0
    dp_link, dp_nics, dp_nodes = ring_link(gradient_groups(dp, pp, cp, tp), a)
    dp_bw = ring_bandwidth(dp_link, dp_nics, a)
    big = params.index(p_gpu)
    buckets = Ls + (big == 0) + (big == pp - 1)  # pp 1: L + 2
    reduce_lat = nccl_ring_latency_us("reduce_scatter" if mode == "zero1" else "all_reduce", n, dp_nodes, a) * 1e-6
    gather_lat = nccl_ring_latency_us("all_gather", n, dp_nodes, a) * 1e-6 if mode == "zero1" else 0.0
    reduce_s = reduce_bytes / dp_bw + buckets * reduce_lat
    gather_s = gather_bytes / dp_bw + buckets * gather_lat
    # Tied embeddings under PP: the first and the last stage sum their copies' gradients (fp32), after
    # the backward, on the critical path: an all-reduce over the two (tied_embedding.cpp).
    embed_bytes = tensors[0][0] * FP32 if pp > 1 and m["tie_word_embeddings"] else 0
    embed_link = links["wrap"] if pp > 1 else "nvlink"
    embed_lat = nccl_ring_latency_us("all_reduce", 2, 2 if embed_link == "ib" else 1, a) * 1e-6 if embed_bytes else 0.0
    embed_s = embed_bytes / bandwidth(embed_link, a) + embed_lat

    # Overlap: each layer's gradients are reduced as soon as its backward ends, during the rest of
    # the last micro-batch's backward (2/3 of its compute); ZeRO-1's all-gather of layer l runs
    # during the next step's forward of layers < l (1/3). One layer's share of each stays exposed.
    def exposed(comm_s, hide_s):
        return max(comm_s - hide_s, comm_s / Ls) if comm_s > 0 else 0.0
    micro_s = compute_s / micro_steps if pp == 1 else slow_ovl["compute"]
    reduce_exposed, gather_exposed = exposed(reduce_s, micro_s * 2 / 3), exposed(gather_s, micro_s / 3)
    step_plain = compute_s + imbalance + tp_s + cp_s + bubble + p2p_s + reduce_s + gather_s + embed_s
    step_overlap = (compute_s + imbalance_ovl + tp_ovl_s + cp_exposed + bubble_ovl + p2p_exposed +
                    reduce_exposed + gather_exposed + embed_s)

    # Memory per GPU: parameters, gradients and optimizer state (ZeRO-1 shards over dp x cp), and the
    # CUDA engine's activations and workspaces, per pipeline rank for the micro-batches its schedule
    # keeps in flight; the largest rank counts.
    shards = n if mode == "zero1" else 1
    per_stage = []
    for r in range(pp):
        st_r = state_bytes(params[r], gbytes, a.master, shards)
        if pp == 1:
            act_r = cuda_activations(m, tp, mb, seq, recompute, sp, cp)
            slots = chunks_held = 1
        else:
            slots = micro_batches_in_flight(pp, v, r, micro_steps)
            chunks_held = chunk_passes_in_flight(pp, v, r, micro_steps)
            act_r = cuda_activations(m, tp, mb, seq, recompute, sp, cp,
                                     {"layers": Ls, "runs": v, "head": r == pp - 1, "slots": slots,
                                      "tensors": tensors[r]})
        per_stage.append({"stage": r, "params": params[r], "state_bytes": st_r, "activation_bytes": act_r,
                          "micro_batches_in_flight": slots, "chunk_passes_in_flight": chunks_held,
                          "memory_gib": (st_r + act_r["total"]) / 2**30})
    top = max(per_stage, key=lambda x: x["memory_gib"])
    st, act, mem_gib = top["state_bytes"], top["activation_bytes"], top["memory_gib"]

    if a.search is None:
        label = "dp %d x tp %d" % (dp, tp)
    else:
        label = "dp %d x %scp %d x tp %d%s" % (dp, "" if pp == 1 else "pp %d%s x " % (pp, " v %d" % v if v > 1 else ""),
                                              cp, tp, " SP" if sp else "")
    ideal = compute_s  # the balanced compute of one GPU
    return {
        "layout": label, "dp": dp, "pp": pp, "v": v, "cp": cp, "tp": tp, "sp": sp, "mode": mode,
        "grad_dtype": a.grad_dtype, "micro_batches_per_gpu": micro_steps,
        "params_per_gpu": p_gpu,
        "tp_collectives_per_layer": tp_collectives_per_layer(recompute, sp) if tp > 1 else {},
        "tp_collectives_per_micro_batch": slow["coll"] if tp > 1 else {},
        "tp_buffer_bytes": tp_buf if tp > 1 else 0,
        "tp_bytes_per_gpu": tp_bytes, "tp_link": tp_link, "tp_nics_per_node": tp_nics, "tp_ring_GBps": tp_bw / 1e9,
        "tp_nodes": tp_nodes, "tp_comm_s": tp_s, "tp_latency_s": tp_lat_s,
        "cp_ring_bytes_per_layer": ring_layer, "cp_halo_bytes_per_layer": halo_layer,
        "cp_ring_step_bytes_forward": ring_fwd_step if cp > 1 else 0,
        "cp_ring_step_bytes_backward": ring_bwd_step if cp > 1 else 0,
        "cp_ring_over_attention_forward": ratio_fwd, "cp_ring_over_attention_backward": ratio_bwd,
        "cp_ring_hides": cp > 1 and max(ratio_fwd, ratio_bwd) <= 1.0,
        "cp_bytes_per_gpu": cp_bytes, "cp_link": cp_link, "cp_nodes": cp_nodes, "cp_comm_s": cp_s,
        "cp_latency_s": cp_lat_s, "cp_comm_exposed_overlap_s": cp_exposed,
        "pp_bubble_fraction": (pp - 1) / (micro_steps * v), "pp_bubble_s": bubble, "pp_bubble_overlap_s": bubble_ovl,
        "pp_imbalance_s": imbalance, "pp_p2p_bytes_per_message": p2p_msg if pp > 1 else 0,
        "pp_p2p_bytes_per_gpu": p2p_bytes, "pp_p2p_link": p2p_link, "pp_boundary_links": links,
        "pp_p2p_message_s": c, "pp_p2p_s": p2p_s, "pp_p2p_latency_s": p2p_lat_s, "pp_p2p_exposed_overlap_s": p2p_exposed,
        "embed_sync_bytes": embed_bytes, "embed_sync_s": embed_s,
        "stages": per_stage if pp > 1 else [],
        "grad_group": n,
        "dp_bytes_per_gpu": reduce_bytes + gather_bytes,
        "dp_reduce_bytes_per_gpu": reduce_bytes, "dp_gather_bytes_per_gpu": gather_bytes,
        "dp_link": dp_link, "dp_nics_per_node": dp_nics, "dp_ring_GBps": dp_bw / 1e9, "dp_nodes": dp_nodes,
        "grad_buckets": buckets, "dp_latency_s": buckets * (reduce_lat + gather_lat),
        "compute_s": compute_s, "dp_comm_s": reduce_s + gather_s,
        "dp_comm_exposed_overlap_s": reduce_exposed + gather_exposed,
        "latency_us": {"tp_all_reduce": 1e6 * tp_lat["all_reduce"] if tp > 1 else 0.0,
                       "tp_all_gather": 1e6 * tp_lat["all_gather"] if tp > 1 else 0.0,
                       "cp_step_forward": 1e6 * cp_step_lat, "cp_step_backward": 2e6 * cp_step_lat,
                       "cp_halo_all_gather": 1e6 * halo_lat if halo_gathers else 0.0,
                       "dp_reduce": 1e6 * reduce_lat, "dp_gather": 1e6 * gather_lat,
                       "pp_send": 1e6 * p2p_lat, "embed_sync": 1e6 * embed_lat},
        "latency_s": tp_lat_s + cp_lat_s + p2p_lat_s + buckets * (reduce_lat + gather_lat) + embed_lat,
        "step_s": step_plain, "step_overlap_s": step_overlap,
        "efficiency": ideal / step_plain, "efficiency_overlap": ideal / step_overlap,
        "tokens_per_s_overlap": gb * seq / step_overlap,
        "mfu_overlap": flops / (a.gpus * a.peak_tflops * 1e12 * step_overlap),
        "state_bytes": st, "activation_bytes": act, "memory_stage": top["stage"],
        "memory_gib": mem_gib, "fits": mem_gib <= a.gpu_mem_gib,
    }


MODES = {"dp": "DP all-reduce", "zero1": "ZeRO-1"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--gpus", help="GPUs (--recommend: a comma-separated list, default 8,16,64,256,1024)")
    p.add_argument("--tp", type=int, help="one tensor-parallel size (default: every one of 1, 2, 4, 8 that fits; "
                                          "the layout search: every power of two)")
    p.add_argument("--cp", help="context-parallel size, or 'all' for every one that divides: the layout search")
    p.add_argument("--sp", choices=["both", "on", "off"],
                   help="sequence parallelism where tp > 1 (default both): the layout search")
    p.add_argument("--pp", help="pipeline stages, or 'all' for every pp that splits the layers: the layout search")
    p.add_argument("--virtual-stages", help="interleaved 1F1B: virtual stages per pipeline rank, or 'all' "
                                            "(default 1)")
    p.add_argument("--p2p-dtype", choices=["bf16", "fp32"], default="bf16",
                   help="dtype of the activations and gradients sent between stages (default bf16; the CPU "
                        "engine sends fp32)")
    p.add_argument("--recommend", action="store_true",
                   help="the best layout (with and without pipeline parallelism) for each of --gpus, from the "
                        "full search (every tp, cp, pp, virtual stages, SP)")
    p.add_argument("--all", action="store_true", help="layout search: print the layouts that do not fit too")
    p.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default: the config's)")
    p.add_argument("--global-batch", type=int, help="sequences per step (default: micro_batch_size x grad_accum_steps)")
    p.add_argument("--seq-len", type=int, help="default: the config's train.seq_len")
    p.add_argument("--recompute", choices=["none", "attention", "full"], help="default: the config's train.recompute")
    p.add_argument("--grad-dtype", choices=["fp32", "bf16"], default="fp32",
                   help="dtype of the reduced gradients (kvshift's engines accumulate fp32)")
    p.add_argument("--master", choices=["sharded", "replicated"], default="sharded",
                   help="fp32 master weights sharded by ZeRO-1 with the moments (default; the CUDA engine's "
                        "train.shard_master) or on every GPU (train.shard_master false)")
    p.add_argument("--mfu", type=float, default=0.45, help="achieved MFU assumed for the compute (default 0.45)")
    p.add_argument("--peak-tflops", type=float, default=989, help="peak dense bf16 TFLOP/s (H100 SXM: 989)")
    p.add_argument("--nvlink-gbs", type=float, default=450,
                   help="NVLink GB/s per GPU within a node, one direction (default 450: H100/H200 NVLink 4; the "
                        "900 GB/s of the data sheets is both directions together)")
    p.add_argument("--ib-gbps", type=float, default=400,
                   help="InfiniBand Gb/s per GPU (one NIC each) across nodes, one direction (default 400)")
    p.add_argument("--nccl-base-latency-us", type=float, default=8.4,
                   help="latency of every NCCL collective and send, us (default 8.4: NCCL's baseLatencies"
                        "[Ring][Simple], src/graph/tuning.cc, 2.30.7)")
    p.add_argument("--nvlink-latency-us", type=float, default=3.4,
                   help="latency of each ring step within a node, us (default 3.4: NCCL's "
                        "hwLatencies[NVLINK][Ring][Simple])")
    p.add_argument("--ib-latency-us", type=float, default=14.0,
                   help="latency of each ring step that crosses nodes, us (default 14.0: NCCL's "
                        "hwLatencies[NET][Ring][Simple]); 0 for all three: the bandwidth-only model")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--gpu-mem-gib", type=float, default=80)
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    return p.parse_args(argv)


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def search_layouts(m, train, a):
    """Every dp x pp x cp x tp (x virtual stages, x SP) of --gpus that kvshift accepts and the global
    batch splits into; the others as `skipped` ({"tp", "cp", "kind", "why"}, "pp" and "v" for kind pp)."""
    if a.tp is not None:
        tps = [a.tp]
    else:
        tps = [t for t in (2 ** i for i in range(12)) if t <= a.gpus and a.gpus % t == 0 and tp_error(m, t) is None]
    L = m["num_hidden_layers"]
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
            pps = ([a.pp_search] if a.pp_search != "all" else
                   [p for p in divisors(a.gpus // (tp * cp)) if L % p == 0])
            for pp in pps:
                if (a.gpus // (tp * cp)) % pp:
                    skipped.append({"tp": tp, "cp": cp, "pp": pp, "v": 1, "kind": "gpus",
                                    "why": "tp x cp x pp does not divide --gpus"})
                    continue
                dp = a.gpus // (tp * cp * pp)
                if a.global_batch % (dp * a.micro_batch):
                    skipped.append({"tp": tp, "cp": cp, "pp": pp, "dp": dp, "kind": "batch",
                                    "why": "the global batch (%d sequences) is not a multiple of dp %d x micro-batch %d"
                                    % (a.global_batch, dp, a.micro_batch)})
                    continue
                micro = a.global_batch // (dp * a.micro_batch)
                if a.v_search == "all":
                    # Chunks of at least two layers: with one, every layer is a stage boundary, and the
                    # model charges no per-pass overhead that would show the cost of that.
                    vs = [1] if pp == 1 else [v for v in divisors(L // pp) if v == 1 or L // (pp * v) >= 2]
                else:
                    vs = [a.v_search]
                for v in vs:
                    why = pp_error(m, pp, v, micro)
                    if why:
                        skipped.append({"tp": tp, "cp": cp, "pp": pp, "v": v, "dp": dp, "kind": "pp", "why": why})
                        continue
                    sps = [False, True] if tp > 1 else [False]
                    if a.sp != "both":
                        sps = [s for s in sps if s == (a.sp == "on")]
                    for sp in sps:
                        if sp and (a.seq_len % tp or (a.seq_len // cp) % tp):
                            skipped.append({"tp": tp, "cp": cp, "kind": "sp",
                                            "why": "SP: seq_len is not divisible by tp" if a.seq_len % tp
                                            else "SP: seq_len / cp is not divisible by tp"})
                            continue
                        rows.append(predict(m, train, a, dp, cp, tp, sp, "zero1", pp, v))
    rows.sort(key=lambda r: (not r["fits"], r["step_overlap_s"]))
    return rows, skipped


def size_or_all(value, flag):
    """A positive integer, 'all', or None."""
    if value is None or value == "all":
        return value
    need(value.isdigit() and int(value) >= 1, "%s must be a positive integer or 'all', got '%s'" % (flag, value))
    return int(value)


def build(a):
    name, m, train = load_config(a.config)
    need(a.gpus is not None, "--gpus is required")
    need(a.gpus.isdigit(), "--gpus must be a positive integer, got '%s'" % a.gpus)
    a.gpus = int(a.gpus)
    # An explicit 0 is an error below, not the config's value.
    a.micro_batch = train["micro_batch_size"] if a.micro_batch is None else a.micro_batch
    a.seq_len = train["seq_len"] if a.seq_len is None else a.seq_len
    a.global_batch = (train["micro_batch_size"] * train["grad_accum_steps"] if a.global_batch is None
                      else a.global_batch)
    if a.recompute:
        train["recompute"] = a.recompute
    for k in ("gpus", "micro_batch", "seq_len", "global_batch", "gpus_per_node"):
        need(getattr(a, k) >= 1, "--%s must be at least 1" % k.replace("_", "-"))
    need(0 < a.mfu <= 1, "--mfu must be in (0, 1]")
    for k in ("nccl_base_latency_us", "nvlink_latency_us", "ib_latency_us"):
        need(getattr(a, k) >= 0, "--%s must be at least 0" % k.replace("_", "-"))
    a.search = None
    a.pp_search = size_or_all(a.pp, "--pp")
    a.v_search = size_or_all(a.virtual_stages, "--virtual-stages")
    if a.pp_search is not None or a.v_search is not None:
        if a.pp_search is None:
            a.pp_search = "all"
        if a.v_search is None:
            a.v_search = 1
        if a.pp_search != "all":
            need(a.gpus % a.pp_search == 0, "--pp %d does not divide --gpus %d" % (a.pp_search, a.gpus))
            v0 = a.v_search if a.v_search != "all" else 1
            why = pp_error(m, a.pp_search, v0, a.pp_search)  # the shape alone; the batch comes per layout
            need(why is None, "--pp %d: %s" % (a.pp_search, why))
        a.sp = a.sp or "both"
    else:
        a.pp_search, a.v_search = 1, 1
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
              else "no tp divides both --gpus and the model's heads"))
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
                        "gpu_mem_gib": a.gpu_mem_gib, "nccl_base_latency_us": a.nccl_base_latency_us,
                        "nvlink_latency_us": a.nvlink_latency_us, "ib_latency_us": a.ib_latency_us,
                        "nccl_allreduce_across_nodes_factor": NCCL_RING_PLATEAU,
                        "latency_source": "NCCL 2.30.7 src/graph/tuning.cc (5067397c), Ring/Simple"},
        "p2p_dtype": a.p2p_dtype, "rows": rows, "skipped": skipped,
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


def ring_label(x, group):
    """nv, or ib with the NICs a node that carry the group's rings: ib8."""
    return "nv" if x[group + "_link"] == "nvlink" else "ib%d" % x[group + "_nics_per_node"]


def print_header(r):
    a = r["assumptions"]
    print("%s on %d GPUs (%d per node): %.2fB params, %.3g FLOP/token, %d x %d tokens per step (micro-batch %d), "
          "recompute %s" % (r["name"], r["gpus"], r["gpus_per_node"], r["params_total"] / 1e9,
                            r["train_flops_per_token"], r["global_batch_sequences"], r["seq_len"],
                            r["micro_batch"], r["recompute"]))
    print("assumed: MFU %.0f%% of %g TFLOP/s; NVLink %g GB/s one way in a node, InfiniBand %g Gb/s per GPU across nodes; "
          "%s gradients; fp32 master %s" % (100 * a["mfu"], a["peak_tflops"], a["nvlink_GBps"], a["ib_Gbps_per_gpu"],
                                            a["grad_dtype"], a["master"]))
    print("latency (NCCL's Ring/Simple model): %s" % latency_words(a))


def latency_words(a):
    return ("%g us a collective or send + %g us a step in a node + %g us a step across nodes; all-reduces across "
            "nodes x %g" % (a["nccl_base_latency_us"], a["nvlink_latency_us"], a["ib_latency_us"],
                            a["nccl_allreduce_across_nodes_factor"]))


def print_table(r):
    print_header(r)
    a = r["assumptions"]
    head = ("layout", "grad reduction", "mb/GPU", "TP GB/GPU", "DP GB/GPU", "compute s", "TP s", "DP s", "lat s",
            "step s", "eff", "step s ovl", "eff ovl", "MFU ovl", "mem GiB")
    fmt = "%-14s %-14s %6s %10s %10s %9s %7s %7s %6s %8s %5s %10s %7s %7s %9s"
    print(fmt % head)
    for x in r["rows"]:
        print(fmt % (x["layout"], MODES[x["mode"]], x["micro_batches_per_gpu"],
                     gb(x["tp_bytes_per_gpu"]) + ("" if x["tp"] == 1 else "/" + ring_label(x, "tp")),
                     gb(x["dp_bytes_per_gpu"]) + "/" + ring_label(x, "dp"),
                     "%.3f" % x["compute_s"], "%.3f" % x["tp_comm_s"], "%.3f" % x["dp_comm_s"],
                     "%.3f" % x["latency_s"], "%.3f" % x["step_s"], pct(x["efficiency"]), "%.3f" % x["step_overlap_s"],
                     pct(x["efficiency_overlap"]), "%.1f%%" % (100 * x["mfu_overlap"]),
                     "%.1f%s" % (x["memory_gib"], "" if x["fits"] else " !")))
    print("GB/GPU: bytes each GPU sends per step (/nv NVLink, /ibK InfiniBand through the group's K NICs a node); "
          "TP s and DP s include NCCL's latency, lat s is that latency (serial); compute includes recomputation; "
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
    where = ring_label(x, "tp")
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


def describe_p2p(x):
    if x["pp"] == 1:
        return "-"
    sends = 2 * x["v"] if x["pp"] > 2 else 2 * x["v"] - 1
    return "%d x %s MB %s, bubble %.1f%%" % (sends, mb_(x["pp_p2p_bytes_per_message"]), x["pp_p2p_link"][:2],
                                           100 * x["pp_bubble_fraction"])


def print_search(r, show_all):
    print_header(r)
    a = r["assumptions"]
    rows = [x for x in r["rows"] if x["fits"] or show_all]
    hidden = len(r["rows"]) - len(rows)
    print("\ncommunication of each GPU, per layer and micro-batch (AR all-reduce, AG all-gather, RS reduce-scatter "
          "of the buffer shown; ring: forward steps x bytes + backward steps x bytes), and per step for the gradients:")
    piped = any(x["pp"] > 1 for x in r["rows"])
    w = 36 if piped else 26
    fmt = "%-" + str(w) + "s %-26s %-30s %-22s %-10s " + ("%-30s " if piped else "%s") + ("%s" if piped else "")
    head = ["layout", "TP / SP per layer", "CP ring per layer", "ring/attention f / b", "halo/layer"]
    head += (["PP p2p per micro-batch"] if piped else []) + ["grads over dp x cp: RS + AG per step"]
    print(fmt % tuple(head))
    for x in rows:
        ring, ratio, halo = describe_ring(x, r["recompute"])
        cols = [x["layout"], describe_tp(x), ring, ratio, halo] + ([describe_p2p(x)] if piped else [])
        cols.append("%s + %s GB %s (%d ranks)" % (gb(x["dp_reduce_bytes_per_gpu"]), gb(x["dp_gather_bytes_per_gpu"]),
                                                  ring_label(x, "dp"), x["grad_group"]))
        print(fmt % tuple(cols))
    print("\nstep time and memory per GPU (ZeRO-1 over dp x cp%s):" % (" of each stage" if piped else ""))
    head = ["layout", "mb/GPU", "TP GB", "CP GB", "DP GB", "compute s", "TP s", "CP s", "DP s"]
    head += ["PP GB", "PP s", "bubble", "imbal"] if piped else []
    head += ["lat s", "step s", "eff", "step ovl", "eff ovl", "MFU ovl", "act GiB", "mem GiB"]
    fmt = "%-" + str(w) + "s %6s %7s %7s %7s %9s %6s %6s %6s " + ("%6s %6s %6s %6s " if piped else "") + \
        "%6s %7s %4s %8s %7s %7s %7s %8s"
    print(fmt % tuple(head))
    for x in rows:
        cols = [x["layout"], x["micro_batches_per_gpu"], gb(x["tp_bytes_per_gpu"]), gb(x["cp_bytes_per_gpu"]),
                gb(x["dp_bytes_per_gpu"]), "%.3f" % x["compute_s"], "%.3f" % x["tp_comm_s"],
                "%.3f" % x["cp_comm_s"], "%.3f" % x["dp_comm_s"]]
        if piped:
            cols += [gb(x["pp_p2p_bytes_per_gpu"]), "%.3f" % x["pp_p2p_s"], "%.3f" % x["pp_bubble_s"],
                     "%.3f" % x["pp_imbalance_s"]]
        cols += ["%.3f" % x["latency_s"], "%.3f" % x["step_s"], pct(x["efficiency"]),
                 "%.3f" % x["step_overlap_s"], pct(x["efficiency_overlap"]), "%.1f%%" % (100 * x["mfu_overlap"]),
                 "%.1f" % (x["activation_bytes"]["total"] / 2**30),
                 "%.1f%s" % (x["memory_gib"], "" if x["fits"] else " !")]
        print(fmt % tuple(cols))
    print("GB: bytes each GPU sends per step (nv NVLink, ibK InfiniBand through the group's K NICs a node, ib the "
          "GPU's own NIC); TP, CP, DP and PP s include NCCL's latency, lat s is that latency (serial); ovl: the "
          "ring (its latency too) hidden behind attention as far as it can be, the gradient "
          "reduce-scatter behind the last backward and the all-gather behind the next forward; TP is never hidden; "
          "! = over %g GiB" % a["gpu_mem_gib"])
    if piped:
        print("PP: the busiest stage's sends of activations and gradients (%s) and their time if serial; bubble = "
              "(pp - 1) / (m v) of the slowest stage's m micro-batches; imbal = the slowest stage (the LM head's) "
              "over the balanced compute; with overlap the sends run while the next pass computes; act and mem: the "
              "pipeline rank that needs the most (its micro-batches in flight)" % r["p2p_dtype"])
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
        if s["kind"] not in ("seq", "batch", "pp"):
            print("not possible: tp %d x cp %d: %s" % (s["tp"], s["cp"], s["why"]))
    pp_why = sorted({s["why"] for s in skipped if s["kind"] == "pp"})
    for why in pp_why[:6]:
        print("not possible: %s" % why)
    if len(pp_why) > 6:
        print("not possible: %d more pipeline shapes (--json lists them)" % (len(pp_why) - 6))
    rec, ser = r["recommended"], r["recommended_without_overlap"]
    print("fastest layout that fits: %s" % (rec["layout"] if rec else
                                            "none (lower the micro-batch, recompute, or raise cp or tp)"))
    if rec and ser and ser["layout"] != rec["layout"]:
        print("fastest without overlap: %s" % ser["layout"])


DEFAULT_COUNTS = "8,16,64,256,1024"


def recommend(a):
    """For each GPU count of --gpus: the full layout search (every tp, cp, pp, virtual stages, SP)
    at the config's micro-batch, halved until some layout splits the batch and fits; the fastest
    layout with overlap, and the fastest without pipeline parallelism."""
    counts = a.gpus or DEFAULT_COUNTS
    need(all(c.isdigit() and int(c) >= 1 for c in counts.split(",")),
         "--gpus must be a comma-separated list of positive integers with --recommend, got '%s'" % counts)
    out = []
    for count in [int(c) for c in counts.split(",")]:
        micro = a.micro_batch
        while True:
            b = copy.copy(a)
            b.gpus, b.micro_batch = str(count), micro
            b.cp = a.cp or "all"
            b.pp = a.pp or "all"
            b.virtual_stages = a.virtual_stages or "all"
            b.sp = a.sp or "both"
            try:
                r = build(b)
            except UsageError:
                r = None
            if (r is not None and r["recommended"]) or b.micro_batch == 1:
                break
            micro = b.micro_batch // 2
        fits = [x for x in r["rows"] if x["fits"]] if r else []
        best = min(fits, key=lambda x: x["step_overlap_s"]) if fits else None
        flat = [x for x in fits if x["pp"] == 1]
        best_flat = min(flat, key=lambda x: x["step_overlap_s"]) if flat else None
        best_serial = min(fits, key=lambda x: x["step_s"]) if fits else None
        out.append({"gpus": count, "micro_batch": b.micro_batch, "best": best, "best_without_pp": best_flat,
                    "best_without_overlap": best_serial, "header": r})
    return out


def print_recommend(recs):
    head = next((x["header"] for x in recs if x["header"]), None)
    if head:
        print("%s: %.2fB params, %d x %d tokens per step, recompute %s; assumed MFU %.0f%% of %g TFLOP/s, NVLink %g GB/s "
              "one way, InfiniBand %g Gb/s per GPU, %d GPUs per node, %g GiB; pp stages send %s"
              % (head["name"], head["params_total"] / 1e9, head["global_batch_sequences"], head["seq_len"],
                 head["recompute"], 100 * head["assumptions"]["mfu"], head["assumptions"]["peak_tflops"],
                 head["assumptions"]["nvlink_GBps"], head["assumptions"]["ib_Gbps_per_gpu"], head["gpus_per_node"],
                 head["assumptions"]["gpu_mem_gib"], head["p2p_dtype"]))
        print("latency (NCCL's Ring/Simple model): %s" % latency_words(head["assumptions"]))
    fmt = "%5s %3s  %-36s %8s %4s %6s %6s  %-28s %8s %6s  %-36s %7s"
    print(fmt % ("GPUs", "mb", "fastest (overlap)", "step s", "eff", "MFU", "GiB", "fastest without pp", "step s",
                 "pp gain", "fastest without overlap", "step s"))
    for x in recs:
        b, f, s = x["best"], x["best_without_pp"], x["best_without_overlap"]
        if b is None:
            print(fmt % (x["gpus"], x["micro_batch"], "none fits or splits the batch", "-", "-", "-", "-", "-", "-", "-",
                         "-", "-"))
            continue
        gain = "%+.1f%%" % (100 * (f["step_overlap_s"] / b["step_overlap_s"] - 1)) if f else "only pp"
        print(fmt % (x["gpus"], x["micro_batch"], b["layout"], "%.3f" % b["step_overlap_s"],
                     pct(b["efficiency_overlap"]), "%.1f%%" % (100 * b["mfu_overlap"]), "%.1f" % b["memory_gib"],
                     f["layout"] if f else "none fits", "%.3f" % f["step_overlap_s"] if f else "-", gain,
                     s["layout"], "%.3f" % s["step_s"]))
    print("mb: micro-batch (the config's, halved until a layout splits the batch and fits); pp gain: how much slower "
          "the fastest layout without pipeline parallelism is; every layout shown fits")


def main(argv):
    args = parse_args(argv)
    try:
        if args.recommend:
            _, _, train = load_config(args.config)
            args.micro_batch = args.micro_batch or train["micro_batch_size"]
            recs = recommend(args)
            if args.json:
                print(json.dumps([{k: v for k, v in x.items() if k != "header"} for x in recs]))
            else:
                print_recommend(recs)
            return 0
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
