"""Hugging Face transformers wrapper of the KV shifting Llama in kvshift_core.py.

    model = AutoModelForCausalLM.from_pretrained(export_dir, trust_remote_code=True)
    model.generate(ids, max_new_tokens=20)

The cache (past_key_values) is a tuple per layer:
    (k: rotated shifted keys [B, Hkv, S, D], v: shifted values [B, Hkv, S, D],
     k_tail, v_tail, q_tail: the last W RAW projections [B, W, H, D] (None when not shifted))
so that a new token's shifted key mixes the raw previous k, never an already-mixed one.
"""
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_kvshift_llama import KvShiftLlamaConfig
from .kvshift_core import KvShiftLlamaModel as _CoreModel
from .kvshift_core import past_length, reorder_past


def _own_past(past_key_values):
    """Our tuple cache, or None. An empty transformers Cache object (newer generate() versions
    create one for every model) means "no cache yet"; a filled one cannot hold the raw tails."""
    if past_key_values is None or isinstance(past_key_values, (tuple, list)):
        return tuple(past_key_values) if past_key_values else None
    if getattr(past_key_values, "get_seq_length", lambda: 0)() == 0:
        return None
    raise ValueError("KvShiftLlamaForCausalLM keeps its own cache (shifted k, v plus the raw k/v tails); "
                     "pass back the past_key_values it returned, not a transformers Cache object")


class KvShiftLlamaPreTrainedModel(PreTrainedModel):
    config_class = KvShiftLlamaConfig
    base_model_prefix = "model"
    _no_split_modules = ["DecoderLayer"]
    # Our cache is the tuple above, not a transformers Cache object.
    _supports_cache_class = False
    _supports_static_cache = False

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=std)


class KvShiftLlamaForCausalLM(KvShiftLlamaPreTrainedModel, GenerationMixin):
    _tied_weights_keys = ["lm_head.weight"]

    def __init__(self, config):
        super().__init__(config)
        self.model = _CoreModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, output_attentions=None,
                output_hidden_states=None, return_dict=None, cache_position=None, **kwargs):
        h, past = self.model(input_ids, _own_past(past_key_values), attention_mask, position_ids, inputs_embeds)
        logits = self.lm_head(h).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        if use_cache is False:
            past = None
        if return_dict is False:
            out = (logits, past)
            return ((loss,) + out) if loss is not None else out
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=past)

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None,
                                      inputs_embeds=None, use_cache=True, **kwargs):
        past_key_values = _own_past(past_key_values)
        if past_key_values:
            input_ids = input_ids[:, past_length(past_key_values):]
            inputs_embeds = None
        inputs = {"inputs_embeds": inputs_embeds} if inputs_embeds is not None else {"input_ids": input_ids}
        inputs.update(past_key_values=past_key_values, attention_mask=attention_mask, use_cache=use_cache)
        return inputs

    @staticmethod
    def _reorder_cache(past_key_values, beam_idx):
        return reorder_past(past_key_values, beam_idx)
