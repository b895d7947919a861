"""Config of a kvshift export: Hugging Face's LlamaConfig plus the KV shift.

kv_shift: {"enabled", "window", "shift_k", "shift_v", "shift_q", "parametrization"}
(parametrization "free" | "clamp01" | "sigmoid_gate"); position_encoding: "rope" | "none".
"""
from transformers import LlamaConfig


class KvShiftLlamaConfig(LlamaConfig):
    model_type = "kvshift_llama"

    def __init__(self, kv_shift=None, position_encoding="rope", **kwargs):
        ks = dict(kv_shift or {})
        known = {"enabled", "window", "shift_k", "shift_v", "shift_q", "parametrization"}
        if set(ks) - known:  # a misspelt key would silently load another model
            raise ValueError(f"kv_shift: unknown keys {sorted(set(ks) - known)} (known: {sorted(known)})")
        self.kv_shift = {
            "enabled": bool(ks.get("enabled", True)),
            "window": int(ks.get("window", 1)),
            "shift_k": bool(ks.get("shift_k", True)),
            "shift_v": bool(ks.get("shift_v", True)),
            "shift_q": bool(ks.get("shift_q", False)),
            "parametrization": str(ks.get("parametrization", "free")),
        }
        if self.kv_shift["parametrization"] not in ("free", "clamp01", "sigmoid_gate"):
            raise ValueError(f"kv_shift.parametrization: unknown {self.kv_shift['parametrization']!r}")
        if self.kv_shift["window"] < 1:
            raise ValueError("kv_shift.window must be >= 1")
        if position_encoding not in ("rope", "none"):
            raise ValueError(f"position_encoding must be 'rope' or 'none', got {position_encoding!r}")
        self.position_encoding = position_encoding
        super().__init__(**kwargs)
