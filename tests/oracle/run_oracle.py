#!/usr/bin/python3
"""Model-level oracle: the kvshift engine's logits, loss and every parameter gradient
against the independent PyTorch model in kvshift_torch.py (float64, autograd).

    /usr/bin/python3 tests/oracle/run_oracle.py --kvshift BUILD/kvshift --workdir BUILD/oracle
    /usr/bin/python3 tests/oracle/run_oracle.py --self-test --workdir /tmp/oracle

For each case it draws random weights (numpy, fixed seeds), writes a checkpoint
(config.json + F32 model.safetensors), a token file and a batch, runs
`kvshift forward` and `kvshift backward`, and compares with
rel_err = ||engine - oracle|| / max(||oracle||, 1e-12) < 1e-4.
The self-test (no binary needed) also runs at the end of the normal mode.
Prints one line per check and a final line `N passed, N failed`; exits 1 on any failure.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import traceback

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvshift_torch as kt  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

REL_TOL = 1e-4
torch.set_default_dtype(torch.float64)


# ----------------------------------------------------------------------------- reporting

class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.failures = []

    def record(self, case, name, ok, detail=""):
        status = "PASS" if ok else "FAIL"
        print(f"{case:<22} {name:<52} {detail:<44} {status}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(f"{case}: {name}")

    def compare(self, case, name, got, want, tol=REL_TOL):
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            self.record(case, name, False, f"shape {got.shape} != expected {want.shape}")
            return
        diff = got - want
        rel = float(np.linalg.norm(diff) / max(float(np.linalg.norm(want)), 1e-12))
        maxabs = float(np.max(np.abs(diff))) if diff.size else 0.0
        ok = bool(np.isfinite(got).all()) and rel < tol
        self.record(case, name, ok, f"rel={rel:.2e} maxabs={maxabs:.2e} |ref|max={np.max(np.abs(want)):.2e}")


# ----------------------------------------------------------------------------- cases

def make_config(hidden, heads, kv_heads, ffn, layers, vocab, tied, shift_enabled,
                window=1, shift_k=True, shift_v=True, theta=10000.0, eps=1e-5, position_encoding=None,
                shift_q=None, parametrization=None, document_boundaries=None, bos_token_id=None,
                max_positions=64):
    cfg = {
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": tied,
        "initializer_range": 0.02,
        "kv_shift": {"enabled": shift_enabled, "window": window,
                     "shift_k": shift_k, "shift_v": shift_v},
    }
    if position_encoding is not None:  # left out otherwise: a missing key must read as "rope"
        cfg["position_encoding"] = position_encoding
    if shift_q is not None:  # left out otherwise: a missing key must read as false
        cfg["kv_shift"]["shift_q"] = shift_q
    if parametrization is not None:  # left out otherwise: a missing key must read as "free"
        cfg["kv_shift"]["parametrization"] = parametrization
    if document_boundaries is not None:  # left out otherwise: a missing key must read as "none"
        cfg["document_boundaries"] = document_boundaries
        cfg["bos_token_id"] = bos_token_id
    return cfg


# name, config, batch B, seq T, seed
CASES = [
    ("1_vanilla_mha", make_config(16, 2, 2, 40, 1, 37, False, False), 2, 10, 101),
    ("2_shift_gqa_4x2", make_config(32, 4, 2, 40, 1, 37, False, True, theta=500000.0), 3, 12, 102),
    ("3_shift_mha_tied", make_config(24, 3, 3, 40, 1, 37, True, True, eps=1e-2), 2, 9, 103),
    ("4_shift_k_only", make_config(16, 2, 2, 40, 1, 37, False, True, shift_v=False), 2, 11, 104),
    ("5_shift_2layer_gqa_4x1", make_config(32, 4, 1, 40, 2, 37, False, True), 2, 12, 105),
    ("6_shift_v_only_window2", make_config(16, 2, 1, 40, 1, 37, False, True, window=2,
                                           shift_k=False), 2, 10, 106),
    ("7_shift_window3_gqa_4x2", make_config(32, 4, 2, 40, 1, 37, False, True, window=3), 2, 11, 107),
    ("8_nope_shift_gqa_4x2", make_config(32, 4, 2, 40, 2, 37, False, True, position_encoding="none"),
     2, 10, 108),
    ("9_qkv_shift_gqa_4x2", make_config(32, 4, 2, 40, 2, 37, False, True, shift_q=True), 2, 11, 109),
    ("10_gate_gqa_4x2", make_config(32, 4, 2, 40, 2, 37, False, True, parametrization="sigmoid_gate"),
     2, 10, 110),
    ("11_gate_qkv_gqa_4x1", make_config(32, 4, 1, 40, 1, 37, False, True, shift_q=True,
                                        parametrization="sigmoid_gate"), 2, 10, 111),
    # Packed documents (BOS = 1 is planted at several positions by draw_batch).
    ("12_docs_shift_gqa_4x2", make_config(32, 4, 2, 40, 2, 37, False, True,
                                          document_boundaries="shift", bos_token_id=1), 2, 12, 112),
    ("13_docs_attention_qkv_window2", make_config(32, 4, 2, 40, 2, 37, False, True, window=2, shift_q=True,
                                                  document_boundaries="shift_and_attention", bos_token_id=1),
     2, 12, 113),
    # One sequence, one KV head, three 64-row blocks: on 3 threads the CPU attention's backward takes its
    # per-block units (B * Hkv = 1 leaves threads idle; kernels/cpu/attention.h).
    ("14_long_sequence_gqa_4x1", make_config(32, 4, 1, 40, 1, 37, False, True, max_positions=160), 1, 150, 114),
]
# OpenMP threads for a case's binary (default: the process's CPU budget).
CASE_THREADS = {"14_long_sequence_gqa_4x1": 3}


def draw_weights(cfg_dict, seed):
    """Random weights far from init so that attention is far from uniform (float32)."""
    cfg = kt.KvShiftLlamaConfig.from_dict(cfg_dict)
    model = kt.KvShiftLlama(cfg)  # only for names and shapes
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in model.expected_shapes().items():
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("_shift"):
            w = rng.uniform(-0.5, 1.5, size=shape)
            w.flat[0] = -0.35  # make sure a negative coefficient is always present
            if cfg.sigmoid_gate:  # [unused = 0, gate logit g]
                w[:, 0] = 0.0
                w[:, 1] = rng.uniform(-3.0, 3.0, size=shape[0])
        elif name == "model.embed_tokens.weight":
            w = 0.5 * rng.standard_normal(shape)
        else:
            w = 0.2 * rng.standard_normal(shape)
        out[name] = w.astype(np.float32)
    return out


def draw_batch(vocab, B, T, seed):
    rng = np.random.default_rng(seed + 7919)
    inputs = rng.integers(0, vocab, size=(B, T)).astype(np.int32)
    inputs[0, 0] = 0
    inputs[-1, -1] = vocab - 1
    targets = rng.integers(0, vocab, size=(B, T)).astype(np.int32)
    mask = (rng.random((B, T)) > 0.3).astype(np.float32)
    mask[0, :2] = 0.0       # a masked prefix (prompt-like)
    mask[0, -1] = 1.0
    mask[-1, T // 2] = 0.0  # a hole in the middle
    mask[-1, 0] = 1.0
    return inputs, targets, mask


def write_checkpoint(ckpt_dir, cfg_dict, weights):
    os.makedirs(ckpt_dir, exist_ok=True)
    with open(os.path.join(ckpt_dir, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)
    write_safetensors(os.path.join(ckpt_dir, "model.safetensors"), weights)


def oracle_outputs(ckpt_dir, inputs, targets, mask):
    model = kt.KvShiftLlama.from_checkpoint(ckpt_dir, torch.float64)
    model.zero_grad()
    logits = model(torch.from_numpy(inputs.astype(np.int64)))
    L = kt.loss(logits, torch.from_numpy(targets.astype(np.int64)),
                torch.from_numpy(mask.astype(np.float64)))
    L.backward()
    grads = {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()}
    with torch.no_grad():
        fwd_logits = model(torch.from_numpy(inputs[0].astype(np.int64))).numpy()
    return model, logits.detach().numpy(), float(L.item()), grads, fwd_logits


def run_binary(cmd, tally, case, what, timeout=600):
    env = dict(os.environ)
    if case in CASE_THREADS:
        env["OMP_NUM_THREADS"] = str(CASE_THREADS[case])
    print(f"  $ {'OMP_NUM_THREADS=' + env['OMP_NUM_THREADS'] + ' ' if case in CASE_THREADS else ''}{' '.join(cmd)}",
          flush=True)
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        tally.record(case, f"{what} (runs)", False, f"{type(e).__name__}: {e}")
        return False
    if r.returncode != 0:
        tally.record(case, f"{what} (runs)", False, f"exit code {r.returncode}")
        sys.stdout.write("  ---- stderr ----\n" + r.stderr.decode(errors="replace")[-4000:] + "\n")
        sys.stdout.write("  ---- stdout ----\n" + r.stdout.decode(errors="replace")[-2000:] + "\n")
        return False
    return True


def run_case(binary, workdir, name, cfg_dict, B, T, seed, tally):
    cdir = os.path.join(workdir, name)
    shutil.rmtree(cdir, ignore_errors=True)
    ckpt = os.path.join(cdir, "ckpt")
    weights = draw_weights(cfg_dict, seed)
    write_checkpoint(ckpt, cfg_dict, weights)
    inputs, targets, mask = draw_batch(cfg_dict["vocab_size"], B, T, seed)
    bos = cfg_dict.get("bos_token_id", -1)
    if cfg_dict.get("document_boundaries", "none") != "none":
        inputs[inputs == bos] = bos + 1  # only the planted BOS tokens start documents
        inputs[0, [0, 4, 5, 9]] = bos   # a one-token document (4) and one near the end
        inputs[1, [3, 7]] = bos         # the second row starts mid-document
    batch_path = os.path.join(cdir, "batch.safetensors")
    write_safetensors(batch_path, {"inputs": inputs, "targets": targets, "mask": mask})
    tokens_path = os.path.join(cdir, "tokens.txt")
    with open(tokens_path, "w") as f:
        f.write(" ".join(str(int(t)) for t in inputs[0]) + "\n")

    model, logits, L, grads, fwd_logits = oracle_outputs(ckpt, inputs, targets, mask)
    np.save(os.path.join(cdir, "oracle_logits.npy"), logits)
    if cfg_dict.get("document_boundaries", "none") != "none":
        # Negative control: the planted documents must matter, or the case proves nothing.
        plain = dict(cfg_dict, document_boundaries="none")
        write_checkpoint(ckpt + "_plain", plain, weights)
        plain_logits = oracle_outputs(ckpt + "_plain", inputs, targets, mask)[1]
        d = float(np.abs(plain_logits - logits).max())
        tally.record(name, "documents change the logits (control)", d > 1e-3, f"maxabs={d:.1e}")
    if cfg_dict["rms_norm_eps"] != 1e-5:
        # Negative control: the case's eps must move the logits beyond the tolerance, or an
        # engine on the default eps passes it.
        default_eps = dict(cfg_dict, rms_norm_eps=1e-5)
        write_checkpoint(ckpt + "_default_eps", default_eps, weights)
        other = oracle_outputs(ckpt + "_default_eps", inputs, targets, mask)[1]
        rel = float(np.linalg.norm(other - logits) / np.linalg.norm(logits))
        tally.record(name, "rms_norm_eps changes the logits (control)", rel > 10 * REL_TOL, f"rel={rel:.1e}")

    # forward
    fwd_out = os.path.join(cdir, "forward_logits.npy")
    if run_binary([binary, "forward", "--checkpoint", ckpt, "--tokens", tokens_path,
                   "--out", fwd_out], tally, name, "forward"):
        try:
            got = np.load(fwd_out)
            tally.compare(name, "forward.logits", got, fwd_logits)
        except Exception as e:  # noqa: BLE001
            tally.record(name, "forward.logits (read)", False, f"{type(e).__name__}: {e}")

    # backward
    bwd_out = os.path.join(cdir, "backward.safetensors")
    if not run_binary([binary, "backward", "--checkpoint", ckpt, "--batch", batch_path,
                       "--out", bwd_out], tally, name, "backward"):
        return
    try:
        got = read_safetensors(bwd_out)
    except Exception as e:  # noqa: BLE001
        tally.record(name, "backward output (read)", False, f"{type(e).__name__}: {e}")
        return
    for key, want in [("logits", logits), ("loss", np.array([L]))]:
        if key in got:
            tally.compare(name, key, got[key], want)
        else:
            tally.record(name, key, False, "missing from backward output")
    for pname, want in grads.items():
        key = "grad." + pname
        if key in got:
            tally.compare(name, key, got[key], want)
        else:
            tally.record(name, key, False, "missing from backward output")
    if cfg_dict["kv_shift"].get("parametrization") == "sigmoid_gate":
        # the unused column 0 of a gate tensor has gradient exactly 0, engine and oracle alike
        for pname, want in grads.items():
            if pname.endswith("_shift") and "grad." + pname in got:
                g0 = np.asarray(got["grad." + pname])[:, 0]
                tally.record(name, f"{pname} col 0 grad == 0", bool(np.all(g0 == 0) and np.all(want[:, 0] == 0)),
                             f"max|engine|={np.max(np.abs(g0)):.1e}")
    extra = sorted(k for k in got if k.startswith("grad.") and k[5:] not in grads)
    tally.record(name, "no unexpected grad.* tensors", not extra, ", ".join(extra)[:44])


# ----------------------------------------------------------------------------- self-test

def paper_custom_convolution(U, K):
    """Appendix F of the paper, verbatim apart from comments."""
    bs, seq, h, d = U.shape
    h, w = K.shape
    padding = (w - 1, 0)
    U_padded = F.pad(U, (0, 0, 0, 0, *padding))  # (bs, seq+w-1, h, d)
    U_unfolded = U_padded.unfold(1, w, 1)  # (bs, seq, h, d, w)
    K_expanded = K.unsqueeze(0).unsqueeze(0).unsqueeze(-2)  # (1, 1, h, 1, w)
    V_unfolded = U_unfolded * K_expanded  # (bs, seq, h, d, w)
    V = V_unfolded.sum(dim=-1)  # (bs, seq, h, d)
    return V


def maxdiff(a, b):
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())


def st_shift(t):
    g = torch.Generator().manual_seed(1)
    for W in (1, 2, 3):
        U = torch.randn(2, 7, 3, 4, generator=g)
        K = torch.rand(3, W + 1, generator=g) * 2 - 0.5
        d = maxdiff(kt.kv_shift(U, K), paper_custom_convolution(U, K))
        t.record("self-test", f"shift == paper custom_convolution (W={W})", d < 1e-13, f"maxabs={d:.1e}")
    # the explicit window-1 formula of DESIGN: k^_t = a_cur k_t + a_prev k_{t-1}, k_{-1} = 0
    U = torch.randn(2, 6, 2, 4, generator=g)
    K = torch.tensor([[0.3, -0.2], [1.4, 0.6]])  # [h, (prev, cur)]
    want = torch.zeros_like(U)
    for tt in range(6):
        for h in range(2):
            want[:, tt, h] = K[h, 1] * U[:, tt, h] + (K[h, 0] * U[:, tt - 1, h] if tt > 0 else 0)
    d = maxdiff(kt.kv_shift(U, K), want)
    t.record("self-test", "shift == explicit a_cur*k_t + a_prev*k_{t-1}", d < 1e-13, f"maxabs={d:.1e}")


def st_rope(t):
    g = torch.Generator().manual_seed(2)
    B, H, T, D, theta = 2, 3, 9, 8, 10000.0
    x = torch.randn(B, H, T, D, generator=g)
    cos, sin = kt.rope_cos_sin(T, D, theta)
    got = kt.apply_rope(x, cos, sin)
    want = torch.zeros_like(x)
    half = D // 2
    for p in range(T):
        for i in range(half):
            ang = p * theta ** (-2.0 * i / D)
            c, s = math.cos(ang), math.sin(ang)
            a, b = x[:, :, p, i], x[:, :, p, i + half]
            want[:, :, p, i] = a * c - b * s
            want[:, :, p, i + half] = b * c + a * s
    d = maxdiff(got, want)
    t.record("self-test", "RoPE == explicit rotate_half formula", d < 1e-12, f"maxabs={d:.1e}")
    # relative-position property: <R_m q, R_n k> depends only on m - n
    q, k = torch.randn(D, generator=g), torch.randn(D, generator=g)
    cos, sin = kt.rope_cos_sin(12, D, theta)
    rq = kt.apply_rope(q.expand(12, D), cos, sin)
    rk = kt.apply_rope(k.expand(12, D), cos, sin)
    d = abs(float(rq[7] @ rk[4] - rq[3] @ rk[0]))
    t.record("self-test", "RoPE scores depend on relative position only", d < 1e-12, f"absdiff={d:.1e}")


def random_model(cfg_dict, seed):
    model = kt.KvShiftLlama(cfg_dict)
    model.load_numpy_state(draw_weights(cfg_dict, seed))
    return model


def st_naive_attention(t):
    """A second, loop-based attention layer (numpy scalars) vs KvShiftAttention."""
    cfg_dict = make_config(16, 4, 2, 8, 1, 11, False, True, window=2, theta=100.0)
    model = random_model(cfg_dict, 7)
    attn = model.model.layers[0].self_attn
    cfg = model.cfg
    B, T, C, D, Hq, Hkv = 2, 6, 16, 4, 4, 2
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(3))
    cos, sin = kt.rope_cos_sin(T, D, cfg.rope_theta)
    with torch.no_grad():
        got = attn(x, cos, sin).numpy()
    X = x.numpy()
    Wq, Wk, Wv, Wo = (getattr(attn, n).weight.detach().numpy() for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
    ks, vs = attn.k_shift.detach().numpy(), attn.v_shift.detach().numpy()
    Wn = 2

    def rot(vec, pos):
        out = np.empty_like(vec)
        for i in range(D // 2):
            ang = pos / cfg.rope_theta ** (2 * i / D)
            out[i] = vec[i] * math.cos(ang) - vec[i + D // 2] * math.sin(ang)
            out[i + D // 2] = vec[i + D // 2] * math.cos(ang) + vec[i] * math.sin(ang)
        return out

    want = np.zeros((B, T, C))
    for b in range(B):
        q = X[b] @ Wq.T
        k = X[b] @ Wk.T
        v = X[b] @ Wv.T
        heads = []
        for j in range(Hq):
            h = j // (Hq // Hkv)
            kh = np.zeros((T, D))
            vh = np.zeros((T, D))
            for s in range(T):
                for w in range(Wn + 1):
                    src = s - Wn + w
                    if src >= 0:
                        kh[s] += ks[h, w] * k[src, h * D:(h + 1) * D]
                        vh[s] += vs[h, w] * v[src, h * D:(h + 1) * D]
            o = np.zeros((T, D))
            for s in range(T):
                qs = rot(q[s, j * D:(j + 1) * D], s)
                sc = np.array([qs @ rot(kh[u], u) / math.sqrt(D) for u in range(s + 1)])
                p = np.exp(sc - sc.max())
                p /= p.sum()
                o[s] = sum(p[u] * vh[u] for u in range(s + 1))
            heads.append(o)
        want[b] = np.concatenate(heads, axis=1) @ Wo.T
    d = float(np.max(np.abs(got - want)))
    t.record("self-test", "attention == naive loops (GQA 4x2, window 2)", d < 1e-12, f"maxabs={d:.1e}")


def st_gradcheck(t):
    try:  # torch >= 2.0; torch.nn.utils.stateless's is deprecated there (Debian's 1.13 has only that one)
        from torch.func import functional_call
    except ImportError:
        from torch.nn.utils.stateless import functional_call
    for label, cfg_dict in [
        ("shift KV, GQA 2x1, 2 layers, untied",
         make_config(8, 2, 1, 6, 2, 5, False, True, theta=100.0)),
        ("shift K window 2, MHA, tied",
         make_config(8, 2, 2, 6, 1, 5, True, True, window=2, shift_v=False, theta=100.0)),
    ]:
        model = random_model(cfg_dict, 11)
        names = [n for n, _ in model.named_parameters()]
        params = tuple(p.detach().clone().requires_grad_(True) for _, p in model.named_parameters())
        inputs = torch.tensor([[0, 3, 1, 4], [2, 2, 4, 1]])
        targets = torch.tensor([[3, 1, 4, 0], [2, 4, 1, 3]])
        mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0]])

        def f(*ps):
            logits = functional_call(model, dict(zip(names, ps)), (inputs,))
            return kt.loss(logits, targets, mask)

        try:
            ok = torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-7, rtol=1e-5)
            detail = f"{sum(p.numel() for p in params)} params"
        except Exception as e:  # noqa: BLE001
            ok, detail = False, str(e).splitlines()[0][:44]
        t.record("self-test", f"gradcheck: {label}", ok, detail)


def st_loss_mask(t):
    g = torch.Generator().manual_seed(5)
    B, T, V = 3, 5, 7
    logits = torch.randn(B, T, V, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 1, 1, 1], [0, 0, 1, 0, 0]], dtype=torch.float64)
    L = kt.loss(logits, targets, mask)
    # explicit: mean over scored positions of -log softmax
    terms = []
    for b in range(B):
        for s in range(T):
            if mask[b, s] > 0:
                lp = logits[b, s] - torch.logsumexp(logits[b, s], 0)
                terms.append(-lp[targets[b, s]])
    want = torch.stack(terms).mean()
    d = abs((L - want).item())
    t.record("self-test", "loss == mean CE over scored tokens", d < 1e-13, f"absdiff={d:.1e}")
    ones = torch.ones(B, T)
    d = abs((kt.loss(logits, targets, ones) - F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))).item())
    t.record("self-test", "loss with full mask == F.cross_entropy mean", d < 1e-13, f"absdiff={d:.1e}")
    targets2 = targets.clone()
    targets2[mask == 0] = (targets2[mask == 0] + 1) % V
    d = abs((kt.loss(logits, targets2, mask) - L).item())
    t.record("self-test", "masked targets do not affect the loss", d < 1e-15, f"absdiff={d:.1e}")
    L.backward()
    gm = float(logits.grad[mask == 0].abs().max())
    t.record("self-test", "d loss/d logits == 0 at masked positions", gm == 0.0, f"max={gm:.1e}")
    # d loss/d logits at scored position = (softmax - onehot) / n_scored
    b, s = 1, 2
    want_g = (torch.softmax(logits[b, s], 0) - F.one_hot(targets[b, s], V)) / mask.sum()
    d = maxdiff(logits.grad[b, s], want_g.detach())
    t.record("self-test", "d loss/d logits == (p - onehot)/n_scored", d < 1e-15, f"maxabs={d:.1e}")


def st_gqa_equals_repeated_mha(t):
    gqa_cfg = make_config(16, 4, 1, 12, 2, 13, False, True)
    mha_cfg = make_config(16, 4, 4, 12, 2, 13, False, True)
    gqa = random_model(gqa_cfg, 21)
    mha = kt.KvShiftLlama(mha_cfg)
    state = {n: p.detach().numpy() for n, p in gqa.named_parameters()}
    rep = {}
    for n, a in state.items():
        if n.endswith(("k_proj.weight", "v_proj.weight")):
            rep[n] = np.tile(a, (4, 1))   # [D, C] -> [4D, C]: every head a copy of KV head 0
        elif n.endswith("_shift"):
            rep[n] = np.tile(a, (4, 1))   # [1, W+1] -> [4, W+1]
        else:
            rep[n] = a
    mha.load_numpy_state(rep)
    ids = torch.randint(0, 13, (2, 9), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        d = maxdiff(gqa(ids), mha(ids))
    t.record("self-test", "GQA Hkv=1 == MHA with K/V (and shifts) repeated", d < 1e-12, f"maxabs={d:.1e}")


def st_model_properties(t):
    ids = torch.randint(0, 13, (2, 10), generator=torch.Generator().manual_seed(8))
    # shift with identity coefficients == no shift
    on = make_config(16, 2, 2, 12, 2, 13, False, True, window=2)
    off = make_config(16, 2, 2, 12, 2, 13, False, False)
    m_off = random_model(off, 31)
    st = {n: p.detach().numpy() for n, p in m_off.named_parameters()}
    m_on = kt.KvShiftLlama(on)
    for li in range(2):
        for s in ("k_shift", "v_shift"):
            st[f"model.layers.{li}.self_attn.{s}"] = np.tile([0.0, 0.0, 1.0], (2, 1))
    m_on.load_numpy_state(st)
    with torch.no_grad():
        d = maxdiff(m_on(ids), m_off(ids))
    t.record("self-test", "identity shift coefficients == shift disabled", d < 1e-12, f"maxabs={d:.1e}")
    # shifts really change the output
    m_rand = random_model(on, 31)
    with torch.no_grad():
        d = maxdiff(m_rand(ids), m_off(ids))
    t.record("self-test", "random shift coefficients change the logits", d > 1e-3, f"maxabs={d:.1e}")
    # causality: changing token t leaves logits < t unchanged, changes logits >= t
    ids2 = ids.clone()
    ids2[:, 6] = (ids2[:, 6] + 1) % 13
    with torch.no_grad():
        a, b = m_rand(ids), m_rand(ids2)
    before, after = maxdiff(a[:, :6], b[:, :6]), maxdiff(a[:, 6:], b[:, 6:])
    t.record("self-test", "causal: future token does not change past logits",
             before == 0.0 and after > 1e-6, f"past={before:.1e} future={after:.1e}")
    # position_encoding "none": rope_theta has no effect, and the logits differ from RoPE's
    nope = {**on, "position_encoding": "none"}
    st = {n: p.detach().numpy() for n, p in m_rand.named_parameters()}
    m_nope, m_nope2 = kt.KvShiftLlama(nope), kt.KvShiftLlama({**nope, "rope_theta": 7.0})
    m_nope.load_numpy_state(st)
    m_nope2.load_numpy_state(st)
    with torch.no_grad():
        same, diff = maxdiff(m_nope(ids), m_nope2(ids)), maxdiff(m_nope(ids), m_rand(ids))
    t.record("self-test", "position_encoding none: no RoPE (theta unused)",
             same == 0.0 and diff > 1e-3, f"theta={same:.1e} vs-rope={diff:.1e}")
    # tied == untied with lm_head = embed
    tied = make_config(16, 2, 2, 12, 1, 13, True, True)
    untied = make_config(16, 2, 2, 12, 1, 13, False, True)
    m_t = random_model(tied, 41)
    st = {n: p.detach().numpy() for n, p in m_t.named_parameters()}
    st["lm_head.weight"] = st["model.embed_tokens.weight"]
    m_u = kt.KvShiftLlama(untied)
    m_u.load_numpy_state(st)
    with torch.no_grad():
        d = maxdiff(m_t(ids), m_u(ids))
    t.record("self-test", "tied == untied with lm_head = embed_tokens", d < 1e-13, f"maxabs={d:.1e}")
    # 1-D input == batch of one
    with torch.no_grad():
        d = maxdiff(m_t(ids[1]), m_t(ids)[1])
    t.record("self-test", "forward([T]) == forward([1,T])[0]", d < 1e-13, f"maxabs={d:.1e}")


def st_io(t, workdir):
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "roundtrip.safetensors")
    rng = np.random.default_rng(0)
    tens = {"a": rng.standard_normal((3, 4)).astype(np.float32),
            "b": rng.standard_normal((5,)),
            "c": rng.integers(-5, 5, size=(2, 3)).astype(np.int32),
            "scalar": np.array(1.5, dtype=np.float32)}
    write_safetensors(path, tens, metadata={"format": "pt"})
    back, meta = read_safetensors(path, with_metadata=True)
    ok = (list(back) == list(tens) and meta == {"format": "pt"}
          and all(back[k].dtype == tens[k].dtype and np.array_equal(back[k], tens[k]) for k in tens))
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    t.record("self-test", "safetensors write/read round trip", ok and n % 8 == 0, f"header={n}B")
    # BF16 read: hand-built file
    vals = np.array([1.0, -2.5, 0.15625, 3.0e38], dtype=np.float32)
    bf = (vals.view(np.uint32) >> 16).astype("<u2").tobytes()
    hdr = json.dumps({"x": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, len(bf)]}}).encode()
    bpath = os.path.join(workdir, "bf16.safetensors")
    with open(bpath, "wb") as f:
        f.write(len(hdr).to_bytes(8, "little") + hdr + bf)
    x = read_safetensors(bpath)["x"]
    want = (vals.view(np.uint32) & 0xFFFF0000).view(np.float32).reshape(2, 2)
    t.record("self-test", "safetensors BF16 read", x.dtype == np.float32 and np.array_equal(x, want),
             f"{x.ravel()[:3]}"[:44])
    # checkpoint round trip through from_checkpoint, exact tensor set per case
    for name, cfg_dict, _, _, seed in CASES:
        ckpt = os.path.join(workdir, "ckpt_" + name)
        w = draw_weights(cfg_dict, seed)
        write_checkpoint(ckpt, cfg_dict, w)
        m = kt.KvShiftLlama.from_checkpoint(ckpt)
        ok = all(np.array_equal(p.detach().numpy().astype(np.float32), w[n]) for n, p in m.named_parameters())
        L = cfg_dict["num_hidden_layers"]
        ks = cfg_dict["kv_shift"]
        n_expected = 2 + L * 9 + (0 if cfg_dict["tie_word_embeddings"] else 1) \
            + L * (ks["enabled"] and ks["shift_k"]) + L * (ks["enabled"] and ks["shift_v"]) \
            + L * (ks["enabled"] and ks.get("shift_q", False))
        ok = ok and len(w) == n_expected and ("lm_head.weight" in w) != cfg_dict["tie_word_embeddings"]
        t.record("self-test", f"checkpoint round trip {name}", ok, f"{len(w)} tensors")


def self_test(workdir, tally):
    tests = [st_shift, st_rope, st_naive_attention, st_gradcheck, st_loss_mask,
             st_gqa_equals_repeated_mha, st_model_properties, lambda t: st_io(t, workdir)]
    for fn in tests:
        try:
            fn(tally)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            tally.record("self-test", getattr(fn, "__name__", "st_io") + " raised", False)


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvshift", help="path to the kvshift binary")
    ap.add_argument("--workdir", required=True, help="scratch directory (case files are kept there)")
    ap.add_argument("--self-test", action="store_true", help="only the self-test (no binary needed)")
    ap.add_argument("--cases", default="", help="comma-separated case-name prefixes to run (default all)")
    ap.add_argument("--torch", choices=["system", "current"], default="system",
                    help="system: the running Python's torch (Debian's 1.13 under /usr/bin/python3); current: "
                         "torch 2.x from PyPI in .venv-hf5 (scripts/setup.sh makes it), the system one without it")
    args = ap.parse_args()
    if args.torch == "current" and int(torch.__version__.split(".")[0]) < 2:
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        venv_py = os.path.join(repo, ".venv-hf5", "bin", "python")
        if os.path.exists(venv_py):
            os.execv(venv_py, [venv_py, os.path.abspath(__file__)] + sys.argv[1:])
        print(f"note: no {os.path.dirname(os.path.dirname(venv_py))}: the oracle runs on the system torch", flush=True)
    print(f"oracle: torch {torch.__version__}, numpy {np.__version__}", flush=True)
    if not args.self_test and not args.kvshift:
        ap.error("--kvshift PATH is required unless --self-test")
    os.makedirs(args.workdir, exist_ok=True)
    tally = Tally()
    if not args.self_test:
        binary = os.path.abspath(args.kvshift)
        wanted = [c for c in args.cases.split(",") if c]
        for name, cfg_dict, B, T, seed in CASES:
            if wanted and not any(name.startswith(w) for w in wanted):
                continue
            print(f"== case {name}: B={B} T={T} {json.dumps(cfg_dict['kv_shift'])} "
                  f"H={cfg_dict['num_attention_heads']}/{cfg_dict['num_key_value_heads']} "
                  f"L={cfg_dict['num_hidden_layers']} tied={cfg_dict['tie_word_embeddings']}", flush=True)
            try:
                run_case(binary, args.workdir, name, cfg_dict, B, T, seed, tally)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                tally.record(name, "harness raised", False)
    print("== self-test", flush=True)
    self_test(os.path.join(args.workdir, "self_test"), tally)
    if tally.failures:
        print("failed: " + "; ".join(tally.failures))
    print(f"{tally.passed} passed, {tally.failed} failed", flush=True)
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
