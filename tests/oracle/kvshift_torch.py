"""Independent PyTorch implementation of a Llama-2 decoder with KV shifting attention.

Written from the math (Xu et al., "KV Shifting Attention Enhances Language Modeling",
section 2.2 and appendix F; ../../docs and /work/shared/DESIGN.md), not from the C++
engine. It is the test oracle of the engine's logits, loss and parameter gradients,
and the seed of the project's Hugging Face modeling file.

Model (no biases anywhere):
    x = embed_tokens[input_ids]
    for each layer:
        x = x + o_proj(Attn(input_layernorm(x)))
        h = post_attention_layernorm(x)
        x = x + down_proj(silu(gate_proj(h)) * up_proj(h))
    logits = lm_head(norm(x))            (lm_head = embed_tokens.weight when tied)

RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * w.
Attn: q, k, v = projections; per KV head h, BEFORE RoPE,
    k^_t = sum_{w=0..W} k_shift[h, w] * k_{t-W+w}     (k_{<0} = 0; columns oldest -> current)
    v^_t = sum_{w=0..W} v_shift[h, w] * v_{t-W+w}
(kv_shift.shift_q, appendix J: q^_t = sum_w q_shift[h, w] * q_{t-W+w} per QUERY head too)
then RoPE (Hugging Face rotate_half) on q (or q^) and k^ (skipped when position_encoding is "none"),
causal softmax(q k^T / sqrt(D)) v^,
GQA query head j reads KV head j // (Hq / Hkv), heads concatenated, o_proj.
kv_shift.parametrization (section 4.6): "free" and "clamp01" use the stored tensors as the
coefficients ("clamp01" only projects them onto [0, 1] after each optimizer step, which is
training, not the model); "sigmoid_gate" (window 1) stores [unused, g] per head and uses
coefficients [1 - sigmoid(g), sigmoid(g)] (prev, cur), so the unused column's gradient is 0.

Only the standard library, numpy and torch are used. Run with /usr/bin/python3.
"""
import json
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:  # package-relative when imported as tests.oracle.kvshift_torch
    from .safetensors_io import read_safetensors, write_safetensors
except ImportError:  # plain script directory on sys.path
    from safetensors_io import read_safetensors, write_safetensors


# ----------------------------------------------------------------------------- config

class KvShiftLlamaConfig:
    """The checkpoint's config.json: Hugging Face LlamaConfig key names plus `kv_shift`."""

    REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "rope_theta", "vocab_size")

    def __init__(self, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
                 num_key_value_heads, rms_norm_eps, rope_theta, vocab_size,
                 max_position_embeddings=2048, tie_word_embeddings=False,
                 initializer_range=0.02, kv_shift=None, model_type="llama",
                 position_encoding="rope", document_boundaries="none", bos_token_id=-1, **_ignored):
        self.model_type = model_type
        # Packed documents: a document starts at every bos_token_id after position 0.
        self.document_boundaries = str(document_boundaries)
        if self.document_boundaries not in ("none", "shift", "shift_and_attention"):
            raise ValueError(f"document_boundaries: unknown {document_boundaries!r}")
        self.bos_token_id = int(bos_token_id)
        self.hidden_size = int(hidden_size)
        self.intermediate_size = int(intermediate_size)
        self.num_hidden_layers = int(num_hidden_layers)
        self.num_attention_heads = int(num_attention_heads)
        self.num_key_value_heads = int(num_key_value_heads)
        self.rms_norm_eps = float(rms_norm_eps)
        self.rope_theta = float(rope_theta)
        self.vocab_size = int(vocab_size)
        self.max_position_embeddings = int(max_position_embeddings)
        self.tie_word_embeddings = bool(tie_word_embeddings)
        self.initializer_range = float(initializer_range)
        self.position_encoding = str(position_encoding)  # a missing key (older checkpoints): RoPE
        if self.position_encoding not in ("rope", "none"):
            raise ValueError(f"position_encoding must be 'rope' or 'none', got {position_encoding!r}")
        ks = dict(kv_shift or {})
        self.kv_shift = {
            "enabled": bool(ks.get("enabled", False)),
            "window": int(ks.get("window", 1)),
            "shift_k": bool(ks.get("shift_k", True)),
            "shift_v": bool(ks.get("shift_v", True)),
            "shift_q": bool(ks.get("shift_q", False)),
            "parametrization": str(ks.get("parametrization", "free")),
        }
        if self.kv_shift["parametrization"] not in ("free", "sigmoid_gate", "clamp01"):
            raise ValueError(f"kv_shift.parametrization: unknown {self.kv_shift['parametrization']!r}")
        if self.kv_shift["parametrization"] == "sigmoid_gate" and self.kv_shift["window"] != 1:
            raise ValueError("kv_shift.parametrization 'sigmoid_gate' needs window 1")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")
        if self.kv_shift["window"] < 1:
            raise ValueError("kv_shift.window must be >= 1")

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    @property
    def shift_k(self):
        return self.kv_shift["enabled"] and self.kv_shift["shift_k"]

    @property
    def shift_v(self):
        return self.kv_shift["enabled"] and self.kv_shift["shift_v"]

    @property
    def shift_q(self):
        return self.kv_shift["enabled"] and self.kv_shift["shift_q"]

    @property
    def sigmoid_gate(self):
        return self.kv_shift["enabled"] and self.kv_shift["parametrization"] == "sigmoid_gate"

    @classmethod
    def from_dict(cls, d):
        missing = [k for k in cls.REQUIRED if k not in d]
        if missing:
            raise ValueError(f"config is missing keys: {missing}")
        return cls(**d)

    def to_dict(self):
        return {
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "position_encoding": self.position_encoding,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "kv_shift": dict(self.kv_shift),
            **({"document_boundaries": self.document_boundaries, "bos_token_id": self.bos_token_id}
               if self.document_boundaries != "none" else {}),
        }


# ----------------------------------------------------------------------------- functional pieces

def document_ids(input_ids, bos_token_id):
    """[B, T] -> [B, T]: the index of each position's document (a BOS after position 0
    starts a new one). Two positions are in the same document iff their ids are equal."""
    starts = (input_ids == bos_token_id).long()
    starts[:, 0] = 0
    return torch.cumsum(starts, dim=1)


def kv_shift(x, coef, doc=None):
    """KV shifting along time.

    x: [B, T, H, D]; coef: [H, W+1], columns oldest -> current.
    Returns y with y[:, t, h] = sum_{w=0..W} coef[h, w] * x[:, t-W+w, h]  (x[:, <0] = 0).
    With doc ([B, T] document ids) a term whose position lies in another
    document than t is dropped, as if that document began the sequence.
    """
    B, T, H, D = x.shape
    W = coef.shape[1] - 1
    assert coef.shape[0] == H, (coef.shape, x.shape)
    y = torch.zeros_like(x)
    for w in range(W + 1):
        lag = W - w  # column w reads position t - lag
        if lag >= T:
            continue
        c = coef[:, w].view(1, 1, H, 1)
        if lag == 0:
            y = y + c * x
        else:
            shifted = torch.cat([x.new_zeros(B, lag, H, D), x[:, :T - lag]], dim=1)
            if doc is not None:
                same = torch.zeros(B, T, dtype=torch.bool, device=x.device)
                same[:, lag:] = doc[:, lag:] == doc[:, :T - lag]
                shifted = shifted * same.view(B, T, 1, 1).to(x.dtype)
            y = y + c * shifted
    return y


def shift_coefficients(stored, sigmoid_gate):
    """The coefficients a stored shift tensor stands for: itself, or for the sigmoid gate
    ([H, 2], column 1 = logit g, column 0 unused) [1 - sigmoid(g), sigmoid(g)]."""
    if not sigmoid_gate:
        return stored
    s = torch.sigmoid(stored[:, 1])
    return torch.stack([1.0 - s, s], dim=1)


def rope_cos_sin(T, head_dim, theta, dtype=torch.float64, device=None):
    """cos, sin of shape [T, head_dim] for positions 0..T-1 (Hugging Face layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
                                / head_dim))
    pos = torch.arange(T, dtype=torch.float64, device=device)
    freqs = torch.outer(pos, inv_freq)           # [T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)      # [T, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    """x: [B, H, T, D]; cos/sin: [T, D]."""
    return x * cos + rotate_half(x) * sin


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def loss(logits, targets, mask):
    """Masked mean cross-entropy.

    logits [B, T, V], targets [B, T] (int), mask [B, T] (0/1).
    sum_{b,t} mask[b,t] * CE(logits[b,t], targets[b,t]) / sum(mask).
    (An all-zero mask gives 0: the denominator is clamped to 1.)
    """
    V = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long(), reduction="none")
    m = mask.reshape(-1).to(ce.dtype)
    return (ce * m).sum() / m.sum().clamp(min=1.0)


# ----------------------------------------------------------------------------- modules

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class KvShiftAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        C, D = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, D)
        self.q_proj = nn.Linear(C, self.n_heads * D, bias=False)
        self.k_proj = nn.Linear(C, self.n_kv_heads * D, bias=False)
        self.v_proj = nn.Linear(C, self.n_kv_heads * D, bias=False)
        self.o_proj = nn.Linear(self.n_heads * D, C, bias=False)
        W = cfg.kv_shift["window"]
        if cfg.shift_k:
            self.k_shift = nn.Parameter(torch.zeros(self.n_kv_heads, W + 1))
        if cfg.shift_v:
            self.v_shift = nn.Parameter(torch.zeros(self.n_kv_heads, W + 1))
        if cfg.shift_q:
            self.q_shift = nn.Parameter(torch.zeros(self.n_heads, W + 1))

    def forward(self, x, cos, sin, doc=None):
        B, T, _ = x.shape
        Hq, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        mode = self.cfg.document_boundaries
        shift_doc = doc if mode != "none" else None
        q = self.q_proj(x).view(B, T, Hq, D)
        k = self.k_proj(x).view(B, T, Hkv, D)
        v = self.v_proj(x).view(B, T, Hkv, D)
        gate = self.cfg.sigmoid_gate
        if self.cfg.shift_q:
            q = kv_shift(q, shift_coefficients(self.q_shift, gate), shift_doc)
        if self.cfg.shift_k:
            k = kv_shift(k, shift_coefficients(self.k_shift, gate), shift_doc)
        if self.cfg.shift_v:
            v = kv_shift(v, shift_coefficients(self.v_shift, gate), shift_doc)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))   # [B, H, T, D]
        if self.cfg.position_encoding == "rope":
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
        group = Hq // Hkv
        kv_index = torch.arange(Hq, device=x.device) // group  # query head j -> KV head j // group
        k = k[:, kv_index]
        v = v[:, kv_index]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)      # [B, Hq, T, T]
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        if mode == "shift_and_attention":  # keys of other documents are masked too
            causal = causal | (doc.unsqueeze(2) != doc.unsqueeze(1)).unsqueeze(1)
        scores = scores.masked_fill(causal, float("-inf"))
        att = torch.softmax(scores, dim=-1)
        out = (att @ v).transpose(1, 2).reshape(B, T, Hq * D)
        return self.o_proj(out)


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, Fd = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(C, Fd, bias=False)
        self.up_proj = nn.Linear(C, Fd, bias=False)
        self.down_proj = nn.Linear(Fd, C, bias=False)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = KvShiftAttention(cfg)
        self.mlp = Mlp(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, doc=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, doc)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class KvShiftLlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids):
        T = input_ids.shape[1]
        x = self.embed_tokens(input_ids.long())
        cos, sin = rope_cos_sin(T, self.cfg.head_dim, self.cfg.rope_theta, x.dtype, x.device)
        doc = document_ids(input_ids, self.cfg.bos_token_id) if self.cfg.document_boundaries != "none" else None
        for layer in self.layers:
            x = layer(x, cos, sin, doc)
        return self.norm(x)


class KvShiftLlama(nn.Module):
    """Parameter names equal the checkpoint tensor names (Hugging Face Llama + k_shift/v_shift)."""

    def __init__(self, cfg, dtype=torch.float64):
        super().__init__()
        if isinstance(cfg, dict):
            cfg = KvShiftLlamaConfig.from_dict(cfg)
        self.cfg = cfg
        self.model = KvShiftLlamaModel(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.to(dtype)

    def output_weight(self):
        if self.cfg.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def forward(self, input_ids):
        """input_ids [B, T] (or [T]) -> logits [B, T, V] (or [T, V])."""
        squeeze = input_ids.dim() == 1
        if squeeze:
            input_ids = input_ids.unsqueeze(0)
        logits = F.linear(self.model(input_ids), self.output_weight())
        return logits[0] if squeeze else logits

    # -- weights -------------------------------------------------------------------------

    @torch.no_grad()
    def init_weights(self, generator=None):
        """The paper/DESIGN initialisation: matrices ~ N(0, initializer_range^2), norms 1,
        shift: the W older columns ~ U(0,1), current column 1 - their sum (footnote 14)."""
        std = self.cfg.initializer_range
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.fill_(1.0)
            elif name.endswith("_shift") and self.cfg.sigmoid_gate:
                u = torch.rand(p.shape[0], generator=generator, dtype=torch.float64).clamp(1e-4, 1 - 1e-4)
                p[:, 0] = 0.0
                p[:, 1] = torch.log((1.0 - u) / u).to(p.dtype)  # sigmoid(g) = cur = 1 - u
            elif name.endswith("_shift"):
                u = torch.rand(p.shape[0], p.shape[1] - 1, generator=generator, dtype=torch.float64)
                p[:, :-1] = u.to(p.dtype)
                p[:, -1] = (1.0 - u.sum(dim=1)).to(p.dtype)
            else:
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * std)

    def expected_shapes(self):
        return {n: tuple(p.shape) for n, p in self.named_parameters()}

    @torch.no_grad()
    def load_numpy_state(self, tensors, strict=True):
        params = dict(self.named_parameters())
        if strict:
            missing = sorted(set(params) - set(tensors))
            extra = sorted(set(tensors) - set(params))
            if missing or extra:
                raise ValueError(f"checkpoint tensors mismatch: missing {missing}, unexpected {extra}")
        for name, p in params.items():
            arr = np.asarray(tensors[name])
            if tuple(arr.shape) != tuple(p.shape):
                raise ValueError(f"tensor {name}: shape {arr.shape}, expected {tuple(p.shape)}")
            p.copy_(torch.from_numpy(arr.astype(np.float64)).to(p.dtype))

    def numpy_state(self, np_dtype=np.float32):
        return {n: p.detach().cpu().numpy().astype(np_dtype) for n, p in self.named_parameters()}

    @classmethod
    def from_checkpoint(cls, ckpt_dir, dtype=torch.float64):
        with open(os.path.join(ckpt_dir, "config.json")) as f:
            cfg = KvShiftLlamaConfig.from_dict(json.load(f))
        model = cls(cfg, dtype=dtype)
        model.load_numpy_state(read_safetensors(os.path.join(ckpt_dir, "model.safetensors")))
        return model

    def save_checkpoint(self, ckpt_dir, np_dtype=np.float32):
        os.makedirs(ckpt_dir, exist_ok=True)
        with open(os.path.join(ckpt_dir, "config.json"), "w") as f:
            json.dump(self.cfg.to_dict(), f, indent=2)
        write_safetensors(os.path.join(ckpt_dir, "model.safetensors"), self.numpy_state(np_dtype))
