"""KV shifting Llama in plain torch: the math of the Hugging Face modeling file.

Needs only torch, so tests can run it where transformers is missing; the
transformers wrapper (modeling_kvshift_llama.py) holds these modules and adds
nothing but the PreTrainedModel / generate() plumbing.

Model (Xu et al., "KV Shifting Attention Enhances Language Modeling"; no biases):
    x = embed_tokens[ids]
    per layer: x += o_proj(Attn(input_layernorm(x))); x += down(silu(gate(h)) * up(h)), h = post_attention_layernorm(x)
    logits = lm_head(norm(x))
Attn, per KV head, on the RAW projections and BEFORE RoPE (columns oldest -> current):
    k^_t = sum_{w=0..W} k_shift[h, w] * k_{t-W+w},  v^ likewise,  (q^ too with shift_q, per query head)
with k_{<0} = 0 at the true start of a sequence. Then RoPE (rotate_half) on q and k^,
causal softmax(q k^T / sqrt(D)) v^, GQA query head j reading KV head j // (Hq / Hkv).
"sigmoid_gate" stores [unused, g] per head; the coefficients are [1 - sigmoid(g), sigmoid(g)].

The cache rule: a layer's cache holds the rotated shifted keys and shifted values of
every past position (what attention reads) AND the last W raw (un-shifted, un-rotated)
k, v (and q) projections. A new token's k^_t mixes k_t with those raw projections:
never with an already-mixed k^, never with zeros except at the true sequence start.
"""
import json
import math
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

# The core's cache: one tuple per layer, in this order (the transformers wrapper keeps
# these tuples in its KvShiftCache, a transformers Cache):
K_CACHE, V_CACHE, K_TAIL, V_TAIL, Q_TAIL = range(5)


def shift_settings(cfg):
    """(shift_q, shift_k, shift_v, window, sigmoid_gate) of a config whose kv_shift may be missing."""
    ks = getattr(cfg, "kv_shift", None) or {}
    on = bool(ks.get("enabled", False))
    par = ks.get("parametrization", "free")
    if par not in ("free", "clamp01", "sigmoid_gate"):
        raise ValueError(f"kv_shift.parametrization: unknown {par!r}")
    return (on and bool(ks.get("shift_q", False)), on and bool(ks.get("shift_k", True)),
            on and bool(ks.get("shift_v", True)), int(ks.get("window", 1)), on and par == "sigmoid_gate")


def shift_coefficients(stored, sigmoid_gate):
    """The [H, W+1] coefficients a stored shift tensor stands for."""
    if not sigmoid_gate:
        return stored
    s = torch.sigmoid(stored[:, 1])
    return torch.stack([1.0 - s, s], dim=1)


def paper_shift_init(heads, window, sigmoid_gate):
    """A shift tensor [heads, window + 1] as kvshift initialises one (the paper's footnote 14; src/model/
    params.cpp), drawn from torch's generator: the W older columns ~ U(0, 1), the current one 1 - their
    sum; sigmoid_gate stores [0, logit of the current coefficient]."""
    u = torch.rand(heads, window, dtype=torch.float64)
    if sigmoid_gate:
        u = u[:, :1].clamp(1e-4, 1.0 - 1e-4)
        return torch.cat([torch.zeros_like(u), torch.log((1.0 - u) / u)], dim=1).float()
    return torch.cat([u, 1.0 - u.sum(dim=1, keepdim=True)], dim=1).float()


def shift_with_tail(x, tail, coef):
    """Shift new raw positions x [B, T, H, D] given the raw positions before them.

    tail: [B, P, H, D] raw projections of the P positions just before x (P < W only at
    the true sequence start, where the missing ones are zeros), or None (P = 0).
    Returns (y [B, T, H, D], new_tail: the last min(W, P + T) raw positions)."""
    B, T, H, D = x.shape
    W = coef.shape[1] - 1
    full = x if tail is None or tail.shape[1] == 0 else torch.cat([tail, x], dim=1)
    P = full.shape[1] - T
    if P < W:
        full_padded = torch.cat([x.new_zeros(B, W - P, H, D), full], dim=1)
    else:
        full_padded = full[:, P - W:]
    # position t of x sits at index W + t of full_padded; column w weights t - W + w, index t + w.
    y = torch.zeros_like(x)
    for w in range(W + 1):
        y = y + coef[:, w].to(x.dtype).view(1, 1, H, 1) * full_padded[:, w:w + T]
    return y, full[:, -W:]


ROPE_KEYS = {"default": {"type", "rope_type", "rope_theta", "partial_rotary_factor"}}
ROPE_KEYS["llama3"] = ROPE_KEYS["default"] | {"factor", "low_freq_factor", "high_freq_factor",
                                              "original_max_position_embeddings"}


def _rope_object(key, d):
    """(theta or None, llama3 parameters or None) of one RoPE dict (rope_scaling or rope_parameters)."""
    if not isinstance(d, dict):
        raise ValueError(f"{key}: expected a dict or None, got {d!r}")
    kind = d.get("rope_type", d.get("type", "default"))
    if kind not in ROPE_KEYS:
        raise ValueError(f"{key}.rope_type {kind!r} is not implemented (kvshift implements 'default' and 'llama3')")
    for k, v in d.items():
        if k not in ROPE_KEYS[kind] or (k == "partial_rotary_factor" and v not in (None, 1, 1.0)):
            raise ValueError(f"{key}.{k} = {v!r} is not implemented for rope_type {kind!r}")
    llama3 = None
    if kind == "llama3":
        llama3 = {k: d[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                    "original_max_position_embeddings")}
    return d.get("rope_theta"), llama3


def rope_settings(cfg):
    """(theta, llama3 parameters or None) from a config of either transformers line: 5.x keeps both in
    rope_parameters, 4.x in rope_theta and rope_scaling (an export writes all three). Whatever is present
    must agree; absent means theta 10000 and plain RoPE (LlamaConfig's defaults). Unknown RoPE types and
    keys are refused, never dropped."""
    thetas, scalings = [], []
    if getattr(cfg, "rope_theta", None) is not None:
        thetas.append(("rope_theta", float(cfg.rope_theta)))
    for key in ("rope_scaling", "rope_parameters"):
        d = getattr(cfg, key, None)
        if d:
            theta, llama3 = _rope_object(key, d)
            if theta is not None:
                thetas.append((key + ".rope_theta", float(theta)))
            scalings.append((key, llama3))
    for (ka, a), (kb, b) in zip(thetas, thetas[1:]):
        if a != b:
            raise ValueError(f"{ka} = {a} and {kb} = {b} disagree")
    for (ka, a), (kb, b) in zip(scalings, scalings[1:]):
        if a != b:
            raise ValueError(f"{ka} and {kb} describe different RoPE: {a} vs {b}")
    return (thetas[0][1] if thetas else 10000.0), (scalings[0][1] if scalings else None)


def rope_inv_freq(head_dim, theta, llama3, device=None):
    """inv_freq [D/2] in fp32, as transformers computes it (the default and the llama3 rope types;
    _compute_default_rope_parameters / _compute_llama3_parameters, same operations in the same order)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    if llama3 is None:
        return inv_freq
    factor, low, high = llama3["factor"], llama3["low_freq_factor"], llama3["high_freq_factor"]
    old_context_len = llama3["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low) / (high - low)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_cos_sin(position_ids, inv_freq, dtype):
    """cos, sin [B, T, D] for integer positions [B, T] (Hugging Face layout, fp32 angles)."""
    freqs = position_ids.to(torch.float32)[..., None] * inv_freq.to(position_ids.device)  # [B, T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    """x [B, H, T, D], cos/sin [B, T, D]."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.to(torch.float32) if x.dtype in (torch.float16, torch.bfloat16) else x
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class KvShiftAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg.hidden_size
        self.n_heads, self.n_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = C // self.n_heads
        self.rope = getattr(cfg, "position_encoding", "rope") == "rope"
        # Computed per forward from these (D/2 values): nothing device- or meta-bound at construction.
        self.theta, self.llama3 = rope_settings(cfg)
        # transformers' attn_implementation ("eager" or "sdpa"), read at each forward: it may be set later.
        self.cfg = cfg
        self.q_proj = nn.Linear(C, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(C, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(C, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, C, bias=False)
        self.shift_q, self.shift_k, self.shift_v, W, self.gate = shift_settings(cfg)
        if self.shift_k:
            self.k_shift = nn.Parameter(torch.zeros(self.n_kv_heads, W + 1))
        if self.shift_v:
            self.v_shift = nn.Parameter(torch.zeros(self.n_kv_heads, W + 1))
        if self.shift_q:
            self.q_shift = nn.Parameter(torch.zeros(self.n_heads, W + 1))

    def _shift(self, name, x, tail):
        return shift_with_tail(x, tail, shift_coefficients(getattr(self, name), self.gate))

    def forward(self, x, position_ids, key_bias, layer_past=None, token_mask=None, attentions=None):
        """x [B, T, C]; position_ids [B, T]; key_bias [B, 1, T, S] additive (0 / -large);
        layer_past: this layer's cache tuple or None; token_mask [B, T] (0 = padding, whose raw
        projections are zeroed so a padded sequence starts like a fresh one); attentions: a list
        the softmax weights [B, Hq, T, S] are appended to, or None. -> (out, new cache)."""
        B, T, _ = x.shape
        Hq, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, T, Hq, D)
        k = self.k_proj(x).view(B, T, Hkv, D)
        v = self.v_proj(x).view(B, T, Hkv, D)
        if token_mask is not None:  # masked_fill, not a product: a padding row's garbage may be non-finite
            pad = ~token_mask.bool().view(B, T, 1, 1)
            q, k, v = q.masked_fill(pad, 0.0), k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
        past = layer_past if layer_past is not None else (None,) * 5
        k_tail = v_tail = q_tail = None
        if self.shift_q:
            q, q_tail = self._shift("q_shift", q, past[Q_TAIL])
        if self.shift_k:
            k, k_tail = self._shift("k_shift", k, past[K_TAIL])
        if self.shift_v:
            v, v_tail = self._shift("v_shift", v, past[V_TAIL])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        if self.rope:
            cos, sin = rope_cos_sin(position_ids, rope_inv_freq(D, self.theta, self.llama3, x.device), x.dtype)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past[K_CACHE] is not None:
            k = torch.cat([past[K_CACHE], k], dim=2)
            v = torch.cat([past[V_CACHE], v], dim=2)
        new_past = (k, v, k_tail, v_tail, q_tail)
        group = Hq // Hkv
        kk = k.repeat_interleave(group, dim=1) if group > 1 else k
        vv = v.repeat_interleave(group, dim=1) if group > 1 else v
        if attentions is None and getattr(self.cfg, "_attn_implementation", None) == "sdpa" and \
                hasattr(F, "scaled_dot_product_attention"):
            # torch's fused attention on the shifted, rotated q, k, v (the shift is done above):
            # the mask additive in q's dtype, finite, so a fully masked padding row stays finite.
            mask = torch.zeros(key_bias.shape, dtype=q.dtype, device=q.device).masked_fill(
                key_bias != 0, torch.finfo(q.dtype).min)
            out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
        else:
            # Scores and the (finite) mask in fp32 even for bf16/fp16 weights: a fully masked
            # padding row then gets a uniform softmax, never NaN.
            scores = (q @ kk.transpose(-1, -2)).to(torch.float32) / math.sqrt(D) + key_bias
            att = torch.softmax(scores, dim=-1).to(q.dtype)
            if attentions is not None:
                attentions.append(att)
            out = att @ vv
        out = out.transpose(1, 2).reshape(B, T, Hq * D)
        return self.o_proj(out), new_past


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

    def forward(self, x, position_ids, key_bias, layer_past=None, token_mask=None, attentions=None):
        a, new_past = self.self_attn(self.input_layernorm(x), position_ids, key_bias, layer_past, token_mask,
                                     attentions)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, new_past


def past_length(past):
    return 0 if not past else past[0][K_CACHE].shape[2]


def key_bias_for(attention_mask, T, S, dtype, device):
    """Additive bias [B or 1, 1, T, S]: causal (query i sits at key index S - T + i) and padding."""
    big = torch.finfo(torch.float32).min
    q_pos = torch.arange(S - T, S, device=device)[:, None]
    k_pos = torch.arange(S, device=device)[None, :]
    allowed = (k_pos <= q_pos)[None, None]  # [1, 1, T, S]
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, -S:].bool()
    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill(~allowed, big)
    return bias


class KvShiftLlamaModel(nn.Module):
    """The decoder stack (Hugging Face's `model.` prefix)."""

    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # transformers' gradient_checkpointing_enable() sets it (and _gradient_checkpointing_func).
        self.gradient_checkpointing = False

    def forward(self, input_ids=None, past=None, attention_mask=None, position_ids=None, inputs_embeds=None,
                hidden_states=None, attentions=None):
        """-> (last hidden state [B, T, C], new past: one tuple per layer).
        attention_mask [B, past + T] (1 = token, 0 = padding) covers the cached positions too.
        hidden_states / attentions: lists to append to, or None. As transformers' Llama: the input
        of every layer, then the final normed state (layers + 1 entries); each layer's softmax weights."""
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, T, _ = x.shape
        P = past_length(past)
        if position_ids is None:
            if attention_mask is not None:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]
            else:
                position_ids = torch.arange(P, P + T, device=x.device)[None].expand(B, T)
        key_bias = key_bias_for(attention_mask, T, P + T, x.dtype, x.device)
        token_mask = attention_mask[:, -T:] if attention_mask is not None else None
        new_past = []
        # Recompute each layer in the backward instead of keeping its activations; it then keeps no
        # cache (transformers turns use_cache off for it) and returns no attention weights.
        checkpointed = self.gradient_checkpointing and self.training and torch.is_grad_enabled() and \
            not past and attentions is None
        for i, layer in enumerate(self.layers):
            if hidden_states is not None:
                hidden_states.append(x)
            if checkpointed:
                x = self._gradient_checkpointing_func(
                    lambda h, layer=layer: layer(h, position_ids, key_bias, None, token_mask)[0], x)
                lp = None
            else:
                x, lp = layer(x, position_ids, key_bias, past[i] if past else None, token_mask, attentions)
            new_past.append(lp)
        x = self.norm(x)
        if hidden_states is not None:
            hidden_states.append(x)
        return x, tuple(new_past)


def config_from_dict(d):
    """A plain attribute object from a config.json dict (for use without transformers)."""
    c = dict(d)
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("rms_norm_eps", 1e-6)
    c.setdefault("tie_word_embeddings", False)
    c.setdefault("position_encoding", "rope")
    c.setdefault("kv_shift", None)
    return types.SimpleNamespace(**c)


class KvShiftLlamaCore(nn.Module):
    """The causal LM without transformers: same parameter names as the exported safetensors."""

    def __init__(self, cfg):
        super().__init__()
        if isinstance(cfg, dict):
            cfg = config_from_dict(cfg)
        self.cfg = cfg
        self.model = KvShiftLlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, past=None, attention_mask=None):
        h, new_past = self.model(input_ids, past, attention_mask)
        return self.lm_head(h), new_past

    @torch.no_grad()
    def greedy(self, input_ids, max_new_tokens):
        """Greedy decoding with the cache: prefill, then one token per step."""
        logits, past = self(input_ids)
        out = input_ids
        for _ in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
            logits, past = self(nxt, past)
        return out

    @classmethod
    def from_dir(cls, path, tensors, dtype=torch.float32):
        """Builds from `path`/config.json and a {name: numpy array} dict of weights."""
        with open(f"{path}/config.json") as f:
            model = cls(json.load(f))
        params = dict(model.named_parameters())
        missing = sorted(set(params) - set(tensors) - ({"lm_head.weight"} if model.cfg.tie_word_embeddings else set()))
        extra = sorted(set(tensors) - set(params))
        if missing or extra:
            raise ValueError(f"{path}: tensors do not match the config: missing {missing}, unexpected {extra}")
        with torch.no_grad():
            for name, arr in tensors.items():
                params[name].copy_(torch.as_tensor(arr).to(torch.float32))
        return model.to(dtype)
