"""Hugging Face transformers wrapper of the KV shifting Llama in kvshift_core.py.

    model = AutoModelForCausalLM.from_pretrained(export_dir, trust_remote_code=True)
    model.generate(ids, max_new_tokens=20)

Written for both transformers lines: 4.4x (torch 1.13 and up) and 5.x. What differs between them is
confined to this file: how tied weights are declared, the name of the cache argument and output field
(`past_key_values`, `cache` in later 5.x), and the Cache base class (a torch Module of its own in 4.x,
a list of per-layer objects in 5.x).

The cache is KvShiftCache, a transformers `Cache`. Per layer it keeps what attention reads, the
rotated shifted keys and the shifted values of every past position [B, Hkv, S, D], and the last W
RAW (un-shifted, un-rotated) k, v (and q) projections [B, W, H, D], so that a new token's shifted key
mixes the raw previous k, never an already-mixed one (kvshift_core.py, docs/HF.md "The cache rule").
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_kvshift_llama import KvShiftLlamaConfig
from .kvshift_core import K_CACHE, K_TAIL, Q_TAIL, V_CACHE, V_TAIL, KvShiftAttention, RMSNorm, paper_shift_init
from .kvshift_core import KvShiftLlamaModel as _CoreModel

try:  # transformers 5.x: a Cache is a list of layer objects
    from transformers.cache_utils import DynamicLayer as _LayerBase
except ImportError:  # 4.x: the cache class holds everything itself
    _LayerBase = object

TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])
# The output field generate() reads the cache from: `cache` in later 5.x, `past_key_values` before.
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
_BASE_CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


class KvShiftCacheLayer(_LayerBase):
    """One layer: keys/values (what attention reads) and the raw tails (None when not shifted)."""

    is_sliding = False
    is_croppable = False  # the raw tails of cropped positions are gone: no assisted decoding

    def __init__(self):
        if _LayerBase is not object:
            super().__init__()
        self.keys = self.values = None
        self.tails = (None, None, None)  # k, v, q

    # kvshift_core's per-layer tuple (k, v, k_tail, v_tail, q_tail), in and out.
    def state(self):
        if self.keys is None:
            return None
        return (self.keys, self.values) + self.tails

    def set_state(self, st):
        self.keys, self.values, self.tails = st[K_CACHE], st[V_CACHE], (st[K_TAIL], st[V_TAIL], st[Q_TAIL])
        self.is_initialized = True
        self.device = self.keys.device
        self.dtype = self.keys.dtype

    def _map(self, fn):
        if self.keys is not None:
            self.keys, self.values = fn(self.keys), fn(self.values)
            self.tails = tuple(fn(t) if t is not None else None for t in self.tails)

    def get_seq_length(self, *args):
        return 0 if self.keys is None else self.keys.shape[2]

    def get_max_length(self):
        return -1

    def get_mask_sizes(self, query_length, *args):
        return self.get_seq_length() + query_length, 0

    def lazy_initialization(self, *args, **kwargs):
        pass

    def update(self, *args, **kwargs):
        raise NotImplementedError("KvShiftCacheLayer is filled by KvShiftLlamaForCausalLM itself (it also "
                                  "keeps the raw projections the shift needs)")

    def reorder_cache(self, beam_idx):
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats):
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices):
        self._map(lambda t: t[indices, ...])

    def crop(self, tokens_to_remove):
        raise NotImplementedError("KvShiftCache cannot be cropped: the raw projections the shift needs are "
                                  "kept only for the last positions")

    def reset(self):
        self.keys = self.values = None
        self.tails = (None, None, None)
        self.is_initialized = False

    def offload(self):
        self._map(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self):
        if self.keys is not None and self.keys.device != self.device:
            self._map(lambda t: t.to(self.device, non_blocking=True))


class KvShiftCache(Cache):
    """transformers' Cache interface over KvShiftCacheLayer objects (one per decoder layer)."""

    is_compileable = False

    def __init__(self, num_layers):
        layers = [KvShiftCacheLayer() for _ in range(num_layers)]
        if _LayerBase is not object:
            super().__init__(layers=layers)
        else:
            super().__init__()
            self.layers = layers

    def states(self):
        """The per-layer tuples kvshift_core reads, or None while empty."""
        return None if self.get_seq_length() == 0 else [layer.state() for layer in self.layers]

    def set_states(self, states):
        for layer, st in zip(self.layers, states):
            layer.set_state(st)

    # What generate() and users call, in both lines (the 5.x base would delegate to the layers too).
    def get_seq_length(self, layer_idx=0):
        return self.layers[layer_idx].get_seq_length() if self.layers else 0

    def get_max_length(self, *args):
        return -1 if _LayerBase is not object else None

    def get_max_cache_shape(self, *args):
        return self.get_max_length()

    def get_usable_length(self, new_seq_length, layer_idx=0):
        return self.get_seq_length(layer_idx)

    def reorder_cache(self, beam_idx):
        for layer in self.layers:
            layer.reorder_cache(beam_idx)

    def batch_repeat_interleave(self, repeats):
        for layer in self.layers:
            layer.batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices):
        for layer in self.layers:
            layer.batch_select_indices(indices)

    def crop(self, max_length):
        raise NotImplementedError("KvShiftCache cannot be cropped: the raw projections the shift needs are kept "
                                  "only for the last positions")

    def reset(self):
        for layer in self.layers:
            layer.reset()

    def __len__(self):
        return len(self.layers)

    def __getitem__(self, layer_idx):
        layer = self.layers[layer_idx]
        return layer.keys, layer.values


def _own_cache(past, num_layers):
    """The KvShiftCache to use: the caller's, or a new one. Any other Cache is accepted only while
    empty (transformers may create one for every model); a filled one cannot hold the raw tails."""
    if isinstance(past, KvShiftCache):
        return past
    empty = past is None or (isinstance(past, (tuple, list)) and len(past) == 0) or (
        isinstance(past, Cache) and past.get_seq_length() == 0)
    if not empty:
        raise ValueError("KvShiftLlamaForCausalLM keeps its own cache (KvShiftCache: shifted k, v plus the raw "
                         f"k/v tails); pass back the cache it returned, not a {type(past).__name__}")
    return KvShiftCache(num_layers)


class KvShiftLlamaPreTrainedModel(PreTrainedModel):
    config_class = KvShiftLlamaConfig
    base_model_prefix = "model"
    _no_split_modules = ["DecoderLayer"]
    # The model accepts and returns a Cache (KvShiftCache), but generate() must not make it a
    # DynamicCache or a static cache: the model creates its own on the first step.
    _supports_cache_class = True
    _supports_static_cache = False
    # attn_implementation "sdpa" (torch's fused attention, after the shift and RoPE) or "eager";
    # gradient_checkpointing_enable() recomputes each decoder layer in the backward.
    _supports_sdpa = True
    supports_gradient_checkpointing = True

    @classmethod
    def _supports_default_dynamic_cache(cls, *args):
        return False

    def _init_weights(self, module):
        """kvshift's initialisation (src/model/params.cpp), from torch's generator: for a model made
        from a config, and for parameters a checkpoint lacks (transformers 5.x builds the model on
        the meta device and calls this for them alone: whatever is not set here is left as
        uninitialised memory). A parameter transformers marks as loaded is never touched."""
        def todo(p):
            return p is not None and not getattr(p, "_is_hf_initialized", False)

        with torch.no_grad():
            if isinstance(module, (nn.Linear, nn.Embedding)) and todo(module.weight):
                module.weight.normal_(mean=0.0, std=self.config.initializer_range)
            elif isinstance(module, RMSNorm) and todo(module.weight):
                module.weight.fill_(1.0)
            elif isinstance(module, KvShiftAttention):
                for name in ("q_shift", "k_shift", "v_shift"):
                    p = getattr(module, name, None)
                    if todo(p):
                        p.copy_(paper_shift_init(p.shape[0], p.shape[1] - 1, module.gate))


class KvShiftLlamaModel(KvShiftLlamaPreTrainedModel):
    """The decoder stack alone (AutoModel: embeddings, probes, reward heads): last_hidden_state (after
    the final norm), the cache, and the hidden states and attention weights when asked for."""

    def __init__(self, config):
        super().__init__(config)
        # kvshift_core's modules under their checkpoint names (embed_tokens, layers, norm), and its forward.
        for name, module in _CoreModel(config).named_children():
            setattr(self, name, module)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, cache=None, **kwargs):
        """-> BaseModelOutputWithPast; the cache a KvShiftCache (updated in place when one was passed)."""
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if self.gradient_checkpointing and self.training and past_key_values is None and cache is None:
            use_cache = False  # as transformers' Llama: recomputed layers keep no cache
        past = cache if cache is not None else past_key_values
        kv = _own_cache(past, self.config.num_hidden_layers) if use_cache or past is not None else None
        if output_hidden_states is None:
            output_hidden_states = getattr(self.config, "output_hidden_states", False)
        if output_attentions is None:
            output_attentions = getattr(self.config, "output_attentions", False)
        hidden, attentions = ([] if output_hidden_states else None), ([] if output_attentions else None)
        h, states = _CoreModel.forward(self, input_ids, kv.states() if kv is not None else None, attention_mask,
                                       position_ids, inputs_embeds, hidden_states=hidden, attentions=attentions)
        if kv is not None:
            kv.set_states(states)
        out = BaseModelOutputWithPast(last_hidden_state=h, hidden_states=tuple(hidden) if hidden is not None else None,
                                      attentions=tuple(attentions) if attentions is not None else None,
                                      **{_BASE_CACHE_FIELD: kv if use_cache else None})
        return out.to_tuple() if return_dict is False else out


class KvShiftLlamaForCausalLM(KvShiftLlamaPreTrainedModel, GenerationMixin):
    # Tied embeddings (config.tie_word_embeddings): 5.x maps each tied parameter to its source,
    # 4.x lists the tied parameters.
    if TRANSFORMERS_MAJOR >= 5:
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    else:
        _tied_weights_keys = ["lm_head.weight"]

    def __init__(self, config):
        super().__init__(config)
        self.model = KvShiftLlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_decoder(self):
        return self.model

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, output_attentions=None,
                output_hidden_states=None, return_dict=None, cache=None, **kwargs):
        """`cache` and `past_key_values` are the same argument (later transformers 5.x renamed it);
        the returned cache is a KvShiftCache, updated in place when one was passed."""
        base = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=past_key_values, cache=cache, inputs_embeds=inputs_embeds,
                          use_cache=use_cache, output_attentions=output_attentions,
                          output_hidden_states=output_hidden_states)
        kv, hidden, attentions = getattr(base, _BASE_CACHE_FIELD), base.hidden_states, base.attentions
        logits = self.lm_head(base.last_hidden_state).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        if return_dict is False:  # as LlamaForCausalLM: the fields that are set, in order
            out = tuple(x for x in (loss, logits, kv, hidden, attentions) if x is not None)
            return out
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=hidden, attentions=attentions,
                                      **{_CACHE_FIELD: kv})

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None,
                                      inputs_embeds=None, use_cache=True, cache=None, position_ids=None,
                                      **kwargs):
        past = cache if cache is not None else past_key_values
        if past is not None and not isinstance(past, KvShiftCache):
            # Another Cache: an empty one is replaced (the model makes its own); a filled one is refused,
            # as forward() refuses it (it cannot hold the raw k/v tails the shift needs), instead of
            # dropping it together with the prompt tokens it stands for.
            _own_cache(past, self.config.num_hidden_layers)
            past = None
        seen = past.get_seq_length() if past is not None else 0
        if seen:
            # The tokens the cache has not seen. generate() says how many (cache_position); from
            # inputs_embeds, input_ids holds the generated tokens only, so it is shorter than the cache.
            cache_position = kwargs.get("cache_position")
            if cache_position is not None:
                input_ids = input_ids[:, -cache_position.shape[0]:]
            elif inputs_embeds is not None or input_ids.shape[1] <= seen:
                input_ids = input_ids[:, -1:]
            else:
                input_ids = input_ids[:, seen:]
            inputs_embeds = None
        inputs = {"inputs_embeds": inputs_embeds} if inputs_embeds is not None else {"input_ids": input_ids}
        if position_ids is not None:
            inputs["position_ids"] = position_ids[:, -(inputs_embeds if inputs_embeds is not None
                                                       else input_ids).shape[1]:]
        inputs[_CACHE_FIELD] = past if isinstance(past, KvShiftCache) else None
        inputs.update(attention_mask=attention_mask, use_cache=use_cache)
        # generate()'s requests: 5.x passes them here for the model's inputs, 4.x adds them itself.
        for key in ("output_hidden_states", "output_attentions"):
            if key in kwargs:
                inputs[key] = kwargs[key]
        return inputs
