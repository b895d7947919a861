#!/usr/bin/python3
"""Training-step throughput on the CPU: kvshift against PyTorch, side by side in one run.

Engines, timed one after the other (never at the same time) on the same threads, for the
model and train shapes of one kvshift config file:

  kvshift             `kvshift bench --config CFG --device cpu --json` (src/cli/commands/bench.cpp
                      times zero_grad, forward+backward of every micro-batch, the global grad
                      norm, AdamW); it also calibrates the machine's fp32 SGEMM peak on the same
                      threads (kernels/cpu/gemm_peak.h), which every engine's fraction refers to.
  torch <ver> eager   Debian's PyTorch (1.13, /usr/bin/python3; --debian-python).
  torch <ver> eager   the current PyTorch from PyPI in the project's virtual environment
  torch <ver> compile (.venv-hf5, made by scripts/setup.sh; --pypi-python), eager and under
                      torch.compile (inductor, offline; its compile time is reported, not timed).

Each PyTorch engine runs in its own process (this script with --worker) on the same model
built from standard PyTorch ops in float32 (`LeanKvShiftLlama`, checked first against the
project's independent oracle tests/oracle/kvshift_torch.py: same weights -> same logits
within 1e-4), timed on exactly the same step: opt.zero_grad(set_to_none=False); forward +
backward of each of the grad_accum_steps micro-batches (masked mean cross-entropy / accum);
clip_grad_norm_(params, 1.0); torch.optim.AdamW(lr, betas, eps, weight_decay).step().

Why it is fair: same shapes (B, T, accum, every model dimension, untied/tied head, GQA,
kv_shift window), same float32 arithmetic, same thread count (torch.set_num_threads(N) and
train.threads=N), same work per step including gradient clipping and the optimizer, random
tokens with an all-ones mask on both sides, the same warm-up / timed step counts and the
same median (sorted[S // 2], as bench.cpp). All run under the same environment: kvshift
sets GOMP_SPINCOUNT=20000 for itself unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set
(src/core/runtime_env.h), so this script applies the same rule to PyTorch before importing
it. The model FLOP/s use kvshift's count (6*N_nonembedding + 6*N_lm_head + 6*L*T*d_head*n_heads
per token) for every engine. The PyTorch model is what a competent PyTorch user would write
(RoPE tables and the causal mask are precomputed buffers; attention is matmul + additive
causal mask + softmax, since 1.13 has no scaled_dot_product_attention); `--torch-impl
oracle` times the oracle module instead.

A shared machine skews every engine: --rounds R repeats the whole sequence R times
(interleaved) and reports medians, with the 1-minute load average before each run and the
CPU time the hypervisor stole during it (Linux /proc/stat "steal"; a shared VM's neighbours).

  /usr/bin/python3 scripts/bench_cpu_vs_torch.py --config configs/toy/lm-small-kvshift.json --rounds 3
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
DEFAULT_PYPI_PYTHON = os.path.join(REPO_ROOT, ".venv-hf5", "bin", "python")


# ----------------------------------------------------------------------------- machine


def cpu_times():
    """(total, steal) of /proc/stat's aggregate cpu line (USER_HZ ticks), None off Linux: the hypervisor's
    stolen time, as kvshift bench reads it (src/core/cpu_steal.h)."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu "):
                    v = [int(x) for x in line.split()[1:9]]
                    return sum(v), (v[7] if len(v) > 7 else 0)
    except OSError:
        pass
    return None


def steal_fraction(a, b):
    """Steal over [a, b] as a fraction of all CPU time in it; None without /proc/stat."""
    if a is None or b is None:
        return None
    return (b[1] - a[1]) / (b[0] - a[0]) if b[0] > a[0] else 0.0


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


def bench_torch(model, cfg, train, threads, warmup, steps, compile_model=False):
    """Median ms of one optimizer step of `model` (see the module docstring), and the
    seconds of the first step (torch.compile's compilation, with --compile)."""
    set_torch_threads(threads)
    params = [p for p in model.parameters()]
    if compile_model:
        model = torch.compile(model)
    B, T, accum = train["micro_batch_size"], train["seq_len"], train["grad_accum_steps"]
    g = torch.Generator().manual_seed(int(train["seed"]))
    inputs = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T)
    opt = make_adamw(params, train)
    model.train()
    times, first_s = [], None
    for s in range(max(warmup, 1 if compile_model else 0) + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        for _ in range(accum):
            loss = oracle.loss(model(inputs), targets, mask) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if first_s is None:
            first_s = time.perf_counter() - t0
        if s >= max(warmup, 1 if compile_model else 0):
            times.append(time.perf_counter() - t0)
    return median_ms(times), first_s


def make_adamw(params, train):
    kwargs = dict(lr=float(train["lr"]), betas=(float(train["beta1"]), float(train["beta2"])),
                  eps=float(train["eps"]), weight_decay=float(train["weight_decay"]))
    try:
        return torch.optim.AdamW(params, foreach=True, **kwargs)  # multi-tensor path (1.13)
    except TypeError:
        return torch.optim.AdamW(params, **kwargs)


def torch_blas():
    """The BLAS behind PyTorch's CPU GEMMs, in words."""
    mkl = getattr(torch.backends, "mkl", None)
    if mkl is not None and mkl.is_available():
        cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
        return f"MKL ({cap()})" if cap else "MKL"
    core = torch_openblas_core()
    return f"OpenBLAS {core}" if core != "not OpenBLAS" else "BLAS"


def run_kvshift(binary, config, threads, warmup, steps, recalibrate=False):
    """The JSON object `kvshift bench --json` prints (its last JSON line)."""
    cmd = [binary, "bench", "--config", config, "--device", "cpu", "--json",
           "--warmup", str(warmup), "--steps", str(steps), "--set", f"train.threads={threads}"]
    if recalibrate:
        cmd.append("--recalibrate")
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


# ----------------------------------------------------------------------------- worker (one PyTorch engine)

def worker(args):
    """Times one PyTorch engine in this process and prints one JSON object."""
    cfg, train, _ = read_config(args.config)
    threads = args.threads
    check_diff = check_against_oracle(cfg, seed=int(train["seed"]))
    model = build_torch_model(cfg, args.torch_impl, seed=int(train["seed"]))
    ms, first_s = bench_torch(model, cfg, train, threads, args.warmup, args.steps,
                              compile_model=args.worker == "compile")
    tokens = train["micro_batch_size"] * train["seq_len"] * train["grad_accum_steps"]
    print(json.dumps({"torch_version": torch.__version__, "mode": args.worker,
                      "median_ms_per_step": ms, "tokens_per_s": tokens / (ms / 1000.0),
                      "first_step_s": first_s, "blas": torch_blas(),
                      "torch_threads": torch.get_num_threads(),
                      "oracle_check_max_abs_diff": check_diff}))
    return 0


def run_worker(python, mode, args, threads, timeout_s):
    """One PyTorch engine in a fresh process: its JSON object, or {"error": ...}."""
    cmd = [python, os.path.abspath(__file__), "--worker", mode, "--config", args.config,
           "--threads", str(threads), "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--torch-impl", args.torch_impl]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout_s} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.strip().startswith("{"):
            return json.loads(line)
    err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit {proc.returncode}: {err}"}


# ----------------------------------------------------------------------------- report

def median(values):
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None


def print_table(r):
    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)
    print(f"config    {r['config_name']}: B={r['micro_batch_size']} T={r['seq_len']} "
          f"accum={r['grad_accum_steps']} ({r['tokens_per_step']} tokens/step)")
    print(f"threads   {r['threads']}; rounds {r['rounds']} (medians); load average (1 min) before the "
          f"runs {r['loadavg_min']:.2f}-{r['loadavg_max']:.2f}")
    peak = r.get("sgemm_peak_gflops")
    print(f"peak      {fmt(peak, '.1f')} GFLOP/s fp32 SGEMM ({r.get('sgemm_peak_core') or 'n/a'}, "
          f"{r['threads']} threads, kvshift bench's calibration)")
    print(f"OpenMP    spin {os.environ.get('GOMP_SPINCOUNT') or os.environ.get('OMP_WAIT_POLICY') or 'default'}")
    rows = [("engine", "tokens/s", "ms/step", "kvshift/x", "of peak", "BLAS kernels", "note")]
    for e in r["engines"]:
        rows.append((e["name"], fmt(e.get("tokens_per_s"), ",.0f"), fmt(e.get("median_ms_per_step"), ".1f"),
                     fmt(e.get("kvshift_over"), ".2f"),
                     "n/a" if e.get("fraction_of_peak") is None else f"{100 * e['fraction_of_peak']:.1f}%",
                     e.get("blas") or "", e.get("note") or ""))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="kvshift experiment config (JSON)")
    p.add_argument("--kvshift", default=None,
                   help=f"kvshift binary (default {DEFAULT_KVSHIFT}; skipped with a note if absent)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for every engine (default: the config's train.threads, else os.cpu_count())")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat the whole sequence of engines this many times and report medians")
    p.add_argument("--torch-impl", choices=("lean", "oracle"), default="lean",
                   help="PyTorch module to time (default: lean, this script's)")
    p.add_argument("--debian-python", default="/usr/bin/python3",
                   help="Python with Debian's PyTorch ('' to skip)")
    p.add_argument("--pypi-python", default=DEFAULT_PYPI_PYTHON,
                   help="Python of a virtual environment with PyTorch from PyPI (default .venv-hf5; '' to skip)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile engine")
    p.add_argument("--compile-timeout", type=int, default=900,
                   help="seconds allowed for the torch.compile engine, compilation included")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure the SGEMM peak again (kvshift bench --recalibrate) in the first round")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--worker", choices=("eager", "compile"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        p.error("--steps and --rounds must be >= 1 and --warmup >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    cfg, train, name = read_config(args.config)
    threads = args.threads or int(train.get("threads") or 0) or os.cpu_count()
    if args.worker:
        args.threads = threads
        return worker(args)
    B, T, accum = train["micro_batch_size"], train["seq_len"], train["grad_accum_steps"]
    tokens = B * T * accum

    binary = args.kvshift or DEFAULT_KVSHIFT
    notes = []
    if not os.path.exists(binary):
        if args.kvshift:
            sys.exit(f"error: kvshift binary not found: {binary}")
        notes.append(f"{binary} not found: kvshift skipped (pass --kvshift PATH)")
        binary = None
    engines = []  # (name, how to run it)
    if binary:
        engines.append(("kvshift", None, None))
    for python, label in ((args.debian_python, "Debian"), (args.pypi_python, "PyPI")):
        if not python:
            continue
        if not os.path.exists(python):
            notes.append(f"{label} PyTorch skipped: {python} not found")
            continue
        engines.append((f"{label} torch eager", python, "eager"))
        if label == "PyPI" and not args.no_compile:
            engines.append((f"{label} torch compile", python, "compile"))

    runs = {e[0]: [] for e in engines}
    loads = []
    for rnd in range(args.rounds):
        for ename, python, mode in engines:
            loads.append(os.getloadavg()[0])
            times_before = cpu_times()
            if python is None:
                res = run_kvshift(binary, args.config, threads, args.warmup, args.steps,
                                  recalibrate=args.recalibrate and rnd == 0)
            else:
                res = run_worker(python, mode, args, threads,
                                 args.compile_timeout if mode == "compile" else 900)
            res["loadavg_1min_before"] = loads[-1]
            res["cpu_steal_fraction_of_run"] = steal_fraction(times_before, cpu_times())
            runs[ename].append(res)
            steal = res["cpu_steal_fraction_of_run"]
            print(f"round {rnd + 1}/{args.rounds} {ename}: "
                  + (f"{res['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in res else res.get("error", "?"))
                  + f" (load {loads[-1]:.2f}" + (f", CPU steal {100 * steal:.1f}%" if steal is not None else "") + ")",
                  file=sys.stderr)

    kv_runs = runs.get("kvshift", [])
    peak = median([r.get("sgemm_peak_gflops") for r in kv_runs])
    flops_per_token = median([r["model_tflops_per_s"] * 1e12 / r["tokens_per_s"] for r in kv_runs])
    kv_tps = median([r.get("tokens_per_s") for r in kv_runs])
    result_engines = []
    for ename, python, mode in engines:
        ok = [r for r in runs[ename] if "tokens_per_s" in r]
        e = {"name": ename, "runs": runs[ename]}
        if ok:
            last = ok[-1]
            e["tokens_per_s"] = median([r["tokens_per_s"] for r in ok])
            e["median_ms_per_step"] = median([r["median_ms_per_step"] for r in ok])
            if python is None:
                split = ", split" if last.get("gemm_threading") == "split" else ""  # one tile per thread
                if last.get("cpu_replicas", 1) > 1:  # each thread a share of the sequences
                    split += f", {last['cpu_replicas']} thread replicas"
                e["blas"] = (f"{last['gemm_library']}{split} ({last.get('gemm_library_source', '')})"
                             if "gemm_library" in last
                             else f"OpenBLAS {last.get('openblas_core')} ({last.get('openblas_core_source', '')})")
            else:
                e["name"] = f"torch {last['torch_version'].split('+')[0]} {mode}"
                e["blas"] = last.get("blas")
                if mode == "compile":
                    e["note"] = f"first step (compilation) {median([r['first_step_s'] for r in ok]):.0f} s"
            if peak and flops_per_token:
                e["fraction_of_peak"] = e["tokens_per_s"] * flops_per_token / (peak * 1e9)
            if kv_tps:
                e["kvshift_over"] = kv_tps / e["tokens_per_s"]
        else:
            e["note"] = runs[ename][-1].get("error", "failed")
        result_engines.append(e)

    result = {
        "config": args.config, "config_name": name, "threads": threads,
        "micro_batch_size": B, "seq_len": T, "grad_accum_steps": accum, "tokens_per_step": tokens,
        "warmup": args.warmup, "steps": args.steps, "rounds": args.rounds,
        "loadavg_min": min(loads) if loads else 0.0, "loadavg_max": max(loads) if loads else 0.0,
        "sgemm_peak_gflops": peak,
        # the library whose calibration gave the peak ("oneDNN 2.6.3", "OpenBLAS SkylakeX")
        "sgemm_peak_core": (kv_runs[-1].get("sgemm_peak", {}).get("core") or kv_runs[-1].get("openblas_core"))
        if kv_runs else None,
        "model_flops_per_token": flops_per_token,
        "engines": result_engines,
    }
    if notes:
        result["notes"] = notes
        for n in notes:
            print(f"note: {n}", file=sys.stderr)
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
