#!/usr/bin/python3
"""Training-step throughput: kvshift's CPU engine vs the same model in PyTorch (CPU, fp32).

What is compared: the median wall time of one whole optimizer step, and tokens/s derived
from it (tokens per step = micro_batch_size * seq_len * grad_accum_steps), for the model
and train shapes of one kvshift config file.

  kvshift:  `kvshift bench --config CFG --device cpu --json --warmup W --steps S
             --set train.threads=N` (src/cli/commands/bench.cpp times zero_grad,
             forward+backward of every micro-batch, the global grad norm, AdamW).
  PyTorch:  the same model built here from standard PyTorch ops in float32 (`LeanKvShiftLlama`,
            checked first against the project's independent oracle tests/oracle/kvshift_torch.py:
            same weights -> same logits within 1e-4), timed on exactly the same step:
            opt.zero_grad(set_to_none=False); forward + backward of each of the
            grad_accum_steps micro-batches (masked mean cross-entropy / accum);
            clip_grad_norm_(params, 1.0); torch.optim.AdamW(lr, betas, eps, weight_decay).step().

Why it is fair: same shapes (B, T, accum, every model dimension, untied/tied head, GQA,
kv_shift window), same float32 arithmetic, same thread count (torch.set_num_threads(N) and
train.threads=N), same work per step including gradient clipping and the optimizer, random
tokens with an all-ones mask on both sides, the same warm-up / timed step counts and the
same median (sorted[S // 2], as bench.cpp). The two runs happen one after the other, never
at the same time, under the same environment: kvshift sets GOMP_SPINCOUNT=20000 for itself
unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set (src/core/runtime_env.h), so this script
applies the same rule to PyTorch before importing it, and both report the OpenBLAS kernel
family in use (OPENBLAS_CORETYPE, if set, reaches both). The 1-minute load average is
reported because other work on the machine skews both. The PyTorch model is what a competent PyTorch 1.13 user would write
(no per-step re-materialisation: RoPE tables and the causal mask are precomputed buffers;
attention is matmul + additive causal mask + softmax, since 1.13 has no
scaled_dot_product_attention); `--torch-impl oracle` times the oracle module instead.

Run with Debian's Python (torch 1.13 + numpy):
  /usr/bin/python3 scripts/bench_cpu_vs_torch.py --config configs/toy/lm-small-kvshift.json
"""
import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
import time

# The OpenMP spin setting kvshift picks for itself (src/core/runtime_env.cpp), given to
# PyTorch too: libgomp reads it when torch loads, so it must be set before the import.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "20000"

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "oracle"))
import kvshift_torch as oracle  # noqa: E402  (independent reference model, not edited here)

DEFAULT_KVSHIFT = os.path.join("build", "kvshift")


# ----------------------------------------------------------------------------- config

def read_config(path):
    """The kvshift config's model section (as the oracle's config) and train section (dict)."""
    with open(path) as f:
        cfg = json.load(f)
    model_cfg = oracle.KvShiftLlamaConfig.from_dict(cfg["model"])  # ignores unknown keys
    train = {"micro_batch_size": 8, "grad_accum_steps": 1, "seq_len": 128, "threads": 0,
             "lr": 2e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
             "seed": 1234}  # defaults of src/model/config.h
    train.update(cfg.get("train", {}))
    name = cfg.get("name") or os.path.splitext(os.path.basename(path))[0]
    return model_cfg, train, name


# ----------------------------------------------------------------------------- lean PyTorch model

class LeanAttention(nn.Module):
    """Causal GQA self-attention with KV shifting before RoPE; parameter names as the oracle's."""

    def __init__(self, cfg):
        super().__init__()
        C, D = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, D)
        self.window = cfg.kv_shift["window"]
        self.q_proj = nn.Linear(C, self.n_heads * D, bias=False)
        self.k_proj = nn.Linear(C, self.n_kv_heads * D, bias=False)
        self.v_proj = nn.Linear(C, self.n_kv_heads * D, bias=False)
        self.o_proj = nn.Linear(self.n_heads * D, C, bias=False)
        self.k_shift = nn.Parameter(torch.zeros(self.n_kv_heads, self.window + 1)) if cfg.shift_k else None
        self.v_shift = nn.Parameter(torch.zeros(self.n_kv_heads, self.window + 1)) if cfg.shift_v else None

    def shift(self, x, coef):
        """x [B, T, H, D] -> sum_lag coef[:, W - lag] * x[:, t - lag] (zero before t = 0)."""
        T = x.shape[1]
        y = x * coef[:, self.window].view(1, 1, -1, 1)
        for lag in range(1, min(self.window, T - 1) + 1):
            past = F.pad(x[:, :T - lag], (0, 0, 0, 0, lag, 0))
            y = y + past * coef[:, self.window - lag].view(1, 1, -1, 1)
        return y

    def forward(self, x, cos, sin, causal_bias):
        B, T, _ = x.shape
        Hq, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, T, Hq, D)
        k = self.k_proj(x).view(B, T, Hkv, D)
        v = self.v_proj(x).view(B, T, Hkv, D)
        if self.k_shift is not None:
            k = self.shift(k, self.k_shift)
        if self.v_shift is not None:
            v = self.shift(v, self.v_shift)
        q = oracle.apply_rope(q.transpose(1, 2), cos, sin)      # [B, Hq, T, D]
        k = oracle.apply_rope(k.transpose(1, 2), cos, sin)      # [B, Hkv, T, D]
        v = v.transpose(1, 2)
        # GQA without copying K/V: query heads j = g*group .. are consecutive, so the
        # `group` query heads of one KV head stack along time: [B, Hkv, group*T, D].
        group = Hq // Hkv
        q = q.reshape(B, Hkv, group * T, D)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(D)) + causal_bias
        out = torch.matmul(torch.softmax(scores, dim=-1), v)    # [B, Hkv, group*T, D]
        out = out.view(B, Hq, T, D).transpose(1, 2).reshape(B, T, Hq * D)
        return self.o_proj(out)


class LeanDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = LeanAttention(cfg)
        self.mlp = oracle.Mlp(cfg)
        self.input_layernorm = oracle.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = oracle.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, causal_bias):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, causal_bias)
        return x + self.mlp(self.post_attention_layernorm(x))


class LeanModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([LeanDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = oracle.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LeanKvShiftLlama(nn.Module):
    """float32 Llama + KV shifting for training benchmarks. Same parameter names as
    oracle.KvShiftLlama (so state dicts load both ways); RoPE tables and the causal bias
    for seq_len T are built once per length and cached (not parameters)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = LeanModel(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._tables = {}

    def tables(self, T):
        if T not in self._tables:
            cos, sin = oracle.rope_cos_sin(T, self.cfg.head_dim, self.cfg.rope_theta, torch.float32)
            group = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
            bias = torch.full((T, T), float("-inf")).triu(1).repeat(group, 1)  # [group*T, T]
            self._tables[T] = (cos, sin, bias)
        return self._tables[T]

    def forward(self, input_ids):
        cos, sin, bias = self.tables(input_ids.shape[1])
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, bias)
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight
        return F.linear(x, head)


def build_torch_model(cfg, impl, seed):
    """The float32 module to time, initialised as the paper does (oracle.init_weights)."""
    ref = oracle.KvShiftLlama(cfg, dtype=torch.float32)
    ref.init_weights(torch.Generator().manual_seed(seed))
    if impl == "oracle":
        return ref
    lean = LeanKvShiftLlama(cfg)
    lean.load_state_dict(ref.state_dict())
    return lean


def check_against_oracle(cfg, seed, tol=1e-4):
    """Same weights -> same logits (max abs diff <= tol) for the lean module and the oracle.
    Random weights with non-trivial shift coefficients, a short batch; float32 both.
    Returns the max abs difference; raises if it exceeds tol."""
    g = torch.Generator().manual_seed(seed)
    ref = oracle.KvShiftLlama(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            scale = 0.5 if name.endswith("_shift") else (0.1 if "norm" in name else 0.05)
            p.copy_(torch.randn(p.shape, generator=g) * scale + (1.0 if "norm" in name else 0.0))
    lean = LeanKvShiftLlama(cfg)
    lean.load_state_dict(ref.state_dict())
    T = min(64, cfg.max_position_embeddings)
    ids = torch.randint(0, cfg.vocab_size, (2, T), generator=g)
    with torch.no_grad():
        diff = (lean(ids) - ref(ids)).abs().max().item()
    if not diff <= tol:
        raise RuntimeError(f"lean PyTorch model disagrees with the oracle: max |dlogits| = {diff:.3e}")
    return diff


# ----------------------------------------------------------------------------- timing

def median_ms(times_s):
    """Median as bench.cpp takes it: sorted[n // 2], in milliseconds."""
    return sorted(times_s)[len(times_s) // 2] * 1000.0


def set_torch_threads(n):
    """n intra-op (OpenMP) threads, and n BLAS threads where torch's BLAS is OpenBLAS
    (Debian's torch; kvshift calls openblas_set_num_threads(n) likewise)."""
    torch.set_num_threads(n)
    for name in ("libopenblas.so.0", "libopenblas.so"):
        try:
            ctypes.CDLL(name).openblas_set_num_threads(n)
            return
        except (OSError, AttributeError):
            continue


def torch_openblas_core():
    """The OpenBLAS kernel family PyTorch's BLAS runs ("Haswell", "Cooperlake", ...)."""
    for name in ("libopenblas.so.0", "libopenblas.so"):
        try:
            f = ctypes.CDLL(name).openblas_get_corename
            f.restype = ctypes.c_char_p
            return f().decode()
        except (OSError, AttributeError):
            continue
    return "not OpenBLAS"


def bench_torch(model, cfg, train, threads, warmup, steps):
    """Median ms of one optimizer step of `model` (see the module docstring)."""
    set_torch_threads(threads)
    B, T, accum = train["micro_batch_size"], train["seq_len"], train["grad_accum_steps"]
    g = torch.Generator().manual_seed(int(train["seed"]))
    inputs = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T)
    params = [p for p in model.parameters()]
    opt = make_adamw(params, train)
    model.train()
    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        for _ in range(accum):
            loss = oracle.loss(model(inputs), targets, mask) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    return median_ms(times)


def make_adamw(params, train):
    kwargs = dict(lr=float(train["lr"]), betas=(float(train["beta1"]), float(train["beta2"])),
                  eps=float(train["eps"]), weight_decay=float(train["weight_decay"]))
    try:
        return torch.optim.AdamW(params, foreach=True, **kwargs)  # multi-tensor path (1.13)
    except TypeError:
        return torch.optim.AdamW(params, **kwargs)


def run_kvshift(binary, config, threads, warmup, steps):
    """The JSON object `kvshift bench --json` prints (its last JSON line)."""
    cmd = [binary, "bench", "--config", config, "--device", "cpu", "--json",
           "--warmup", str(warmup), "--steps", str(steps), "--set", f"train.threads={threads}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr.strip()}")
    for line in reversed(proc.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            result = json.loads(line)
            missing = [k for k in ("tokens_per_s", "median_ms_per_step") if k not in result]
            if missing:
                raise RuntimeError(f"kvshift bench JSON lacks {missing}: {line}")
            return result
    raise RuntimeError(f"no JSON object in the output of {' '.join(cmd)}:\n{proc.stdout}")


# ----------------------------------------------------------------------------- report

def print_table(r):
    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)
    rows = [
        ("config", r["config_name"]),
        ("shape", f"B={r['micro_batch_size']} T={r['seq_len']} accum={r['grad_accum_steps']} "
                  f"({r['tokens_per_step']} tokens/step)"),
        ("threads", f"{r['threads']} (load average before: {r['loadavg_1min_before']:.2f})"),
        ("torch", f"{r['torch_version']} ({r['torch_impl']} module, oracle check "
                  f"max|dlogits|={r['oracle_check_max_abs_diff']:.1e})"),
        ("OpenBLAS kernels", f"kvshift {r.get('kvshift_openblas_core') or 'n/a'}, "
                             f"PyTorch {r['torch_openblas_core']}"),
        ("OpenMP spin", os.environ.get("GOMP_SPINCOUNT") or os.environ.get("OMP_WAIT_POLICY") or "default"),
        ("kvshift tokens/s", fmt(r["kvshift_tokens_per_s"], ",.0f")),
        ("PyTorch tokens/s", fmt(r["torch_tokens_per_s"], ",.0f")),
        ("ratio kvshift/PyTorch", fmt(r["ratio_kvshift_over_torch"], ".2f")),
        ("kvshift median ms/step", fmt(r["kvshift_median_ms_per_step"], ".1f")),
        ("PyTorch median ms/step", fmt(r["torch_median_ms_per_step"], ".1f")),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if r.get("note"):
        print(f"note: {r['note']}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="kvshift experiment config (JSON)")
    p.add_argument("--kvshift", default=None,
                   help=f"kvshift binary (default {DEFAULT_KVSHIFT}; skipped with a note if absent)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for both (default: the config's train.threads, else os.cpu_count())")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--torch-impl", choices=("lean", "oracle"), default="lean",
                   help="PyTorch module to time (default: lean, this script's)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    cfg, train, name = read_config(args.config)
    threads = args.threads or int(train.get("threads") or 0) or os.cpu_count()
    B, T, accum = train["micro_batch_size"], train["seq_len"], train["grad_accum_steps"]
    tokens = B * T * accum

    load_before = os.getloadavg()[0]  # other work on the machine skews both timings
    check_diff = check_against_oracle(cfg, seed=int(train["seed"]))

    binary = args.kvshift or DEFAULT_KVSHIFT
    kv, note = None, None
    if os.path.exists(binary):
        kv = run_kvshift(binary, args.config, threads, args.warmup, args.steps)
    elif args.kvshift:
        sys.exit(f"error: kvshift binary not found: {binary}")
    else:
        note = f"{binary} not found: kvshift side skipped (pass --kvshift PATH)"

    model = build_torch_model(cfg, args.torch_impl, seed=int(train["seed"]))
    torch_ms = bench_torch(model, cfg, train, threads, args.warmup, args.steps)
    torch_tps = tokens / (torch_ms / 1000.0)

    result = {
        "config": args.config, "config_name": name, "threads": threads,
        "micro_batch_size": B, "seq_len": T, "grad_accum_steps": accum, "tokens_per_step": tokens,
        "warmup": args.warmup, "steps": args.steps, "loadavg_1min_before": load_before,
        "torch_version": torch.__version__, "torch_impl": args.torch_impl,
        "torch_openblas_core": torch_openblas_core(),
        "oracle_check_max_abs_diff": check_diff,
        "kvshift_tokens_per_s": kv["tokens_per_s"] if kv else None,
        "kvshift_openblas_core": kv.get("openblas_core") if kv else None,
        "kvshift_median_ms_per_step": kv["median_ms_per_step"] if kv else None,
        "torch_tokens_per_s": torch_tps,
        "torch_median_ms_per_step": torch_ms,
        "ratio_kvshift_over_torch": kv["tokens_per_s"] / torch_tps if kv else None,
        "kvshift": kv,
    }
    if note:
        result["note"] = note
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        sys.exit(f"error: {e}")
