#!/usr/bin/python3
"""Hugging Face export/import checks (CTest `hf_export` and `hf_export_tf5`).

    /usr/bin/python3 tests/hf/run_hf.py --kvshift BUILD/kvshift --workdir BUILD/hf_test [--stack 4|5]
                                        [--checkpoint CKPT]

--stack 4 (default) runs under .venv-hf/bin/python (scripts/setup.sh: transformers 4.44 pinned for
Debian's torch 1.13) when that venv exists, else under this python with the modeling file's
pure-torch core (python/hf/kvshift_core.py). --stack 5 runs under .venv-hf5/bin/python
(transformers 5.x on torch 2.x from PyPI) and, without it, reports itself skipped. The first line
says which.

Checks, on random-weight checkpoints (the oracle's cases) and one trained by `kvshift train`:
  - export-hf, load (AutoModelForCausalLM with trust_remote_code, or the core), logits equal
    `kvshift forward` within 1e-5 relative: vanilla (a plain LlamaForCausalLM), shifted, GQA,
    tied, window 1, 2 and 3, sigmoid gate, shift_q, NoPE, Llama 3 RoPE;
  - with the cache: logits fed one token at a time equal the full forward, greedy generate()
    equals the argmax of a full forward at every step and `kvshift generate`, beam search with the cache equals beam
    search without it, a left-padded batch equals its rows alone (transformers); a left-padded row's logits,
    full and cached, equal the row alone (both modes);
  - bf16 exports: equal (1e-5) to `kvshift forward` of their own (rounded) weights when computed
    in fp32, within bf16 rounding (2e-2) when computed in bf16;
  - RoPE: the modeling file's inverse frequencies equal transformers' own (default and llama3);
    a Llama saved by the running transformers line (theta 500000; Llama 3 RoPE), in that line's
    config dialect, imports with logits equal to transformers' (and with --kv-shift-init identity,
    exported again, still equal);
  - import-hf(export-hf(ckpt)) equals ckpt bit for bit (fp32), also from shards;
  - import of a HF-layout model with --kv-shift-init identity (window 1, 2, 3) gives the vanilla logits;
  - attn_implementation "sdpa" (5.x's default) == "eager"; gradient checkpointing gives the same
    gradients;
  - output_hidden_states / output_attentions (forward and generate); parameters missing from a
    checkpoint get kvshift's initialisation, the loaded ones stay (transformers);
  - tokenizer files (when sentencepiece is importable); pipeline(model=path) of a shifted export;
    import-hf of a re-saved export (tokenizer.json alone) warns that it took no tokenizer;
  - bad inputs (unknown RoPE types, RoPE keys that disagree, ...) give one-line errors and leave
    no output behind.
  - with --checkpoint CKPT (scripts/gpu_check.sh: a checkpoint trained on the GPU), that one too:
    exported, logits equal `kvshift forward` on the CPU, `kvshift generate` equals greedy generate().
Prints one line per check and `N passed, N failed[, N skipped]` (a group this mode cannot run is a
counted skip line); exits 1 on any failure.
"""
import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STACK = sys.argv[sys.argv.index("--stack") + 1] if "--stack" in sys.argv[:-1] else "4"
VENV = os.path.join(REPO, {"4": ".venv-hf", "5": ".venv-hf5"}.get(STACK, ".venv-hf"))
VENV_PY = os.path.join(VENV, "bin", "python")
if os.path.exists(VENV_PY) and os.path.realpath(sys.prefix) != os.path.realpath(VENV) \
        and not os.environ.get("KVS_HF_NO_VENV"):
    os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__)] + sys.argv[1:])
if STACK == "5" and os.path.realpath(sys.prefix) != os.path.realpath(VENV):
    print(f"skipped: no {VENV} (scripts/setup.sh makes it: transformers 5.x, torch 2.x from PyPI); "
          "nothing was checked against transformers 5.x")
    print("0 passed, 0 failed, 1 skipped")
    sys.exit(77)  # ctest's SKIP_RETURN_CODE: shown as not run, not as passed
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "tests", "oracle"))
sys.path.insert(0, os.path.join(REPO, "python", "hf"))
import kvshift_core as kc  # noqa: E402
from run_oracle import draw_weights, make_config, write_checkpoint  # noqa: E402
from safetensors_io import read_safetensors  # noqa: E402

torch.set_default_dtype(torch.float32)  # run_oracle sets float64; users load in float32

try:
    import transformers  # noqa: E402
    from transformers import AutoModelForCausalLM  # noqa: E402
    HF = True
except ImportError:
    HF = False

REL_TOL = 1e-5
MAJOR = int(transformers.__version__.split(".")[0]) if HF else 0
# from_pretrained's dtype argument: `dtype` in 5.x (which defaults to the config's), `torch_dtype` before.
DTYPE_ARG = "dtype" if MAJOR >= 5 else "torch_dtype"
# The cache argument of forward(): `cache` in later 5.x, `past_key_values` before.
CACHE_ARG = "cache" if HF and "cache" in transformers.modeling_outputs.CausalLMOutputWithPast.__dataclass_fields__ \
    else "past_key_values"
PY_FILES = ["configuration_kvshift_llama.py", "kvshift_core.py", "modeling_kvshift_llama.py"]


class Tally:
    def __init__(self):
        self.passed, self.failed, self.skipped, self.failures = 0, 0, 0, []

    def skip(self, case, what):
        """A group of checks this mode cannot run: printed and counted, never silent."""
        print(f"{case:<18} skipped: {what}", flush=True)
        self.skipped += 1

    def record(self, case, name, ok, detail=""):
        print(f"{case:<18} {name:<50} {detail:<40} {'PASS' if ok else 'FAIL'}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(f"{case}: {name}")

    def compare(self, case, name, got, want, tol=REL_TOL):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got.shape != want.shape:
            return self.record(case, name, False, f"shape {got.shape} != {want.shape}")
        rel = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-12))
        self.record(case, name, bool(np.isfinite(got).all()) and rel < tol, f"rel={rel:.2e}")


def run(cmd, check=True):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return r


def kvshift_logits(binary, ckpt, tokens, workdir):
    tok = os.path.join(workdir, "tokens.txt")
    with open(tok, "w") as f:
        f.write(" ".join(map(str, tokens)) + "\n")
    out = os.path.join(workdir, "logits.npy")
    run([binary, "forward", "--checkpoint", ckpt, "--tokens", tok, "--out", out])
    return np.load(out)


def load_export(out_dir, dtype=torch.float32):
    """The exported model: through transformers when present, else the core."""
    if HF:
        return AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True,
                                                    **{DTYPE_ARG: dtype}).eval()
    index = os.path.join(out_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        tensors = {}
        for f in sorted(set(json.load(open(index))["weight_map"].values())):
            tensors.update(read_safetensors(os.path.join(out_dir, f)))
    else:
        tensors = read_safetensors(os.path.join(out_dir, "model.safetensors"))
    return kc.KvShiftLlamaCore.from_dir(out_dir, tensors, dtype).eval()


@torch.no_grad()
def logits_of(model, ids, past=None):
    """(logits [B, T, V], past) of either model kind."""
    if HF:
        o = model(input_ids=ids, use_cache=True, **{CACHE_ARG: past})
        return o.logits.float(), o.cache if "cache" in o.__dataclass_fields__ else o.past_key_values
    lg, past = model(ids, past)
    return lg.float(), past


@torch.no_grad()
def greedy(model, ids, n):
    if HF:
        # An explicit all-ones mask: generate() would otherwise treat tokens equal to pad_token_id as padding.
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                              min_new_tokens=n, pad_token_id=0, eos_token_id=None)
    return model.greedy(ids, n)


def check_cache(t, case, model, tokens):
    ids = torch.tensor([tokens])
    full = logits_of(model, ids)[0][0]
    lg, past = logits_of(model, ids[:, :3])
    steps = [lg[0]]
    for i in range(3, ids.shape[1]):
        lg, past = logits_of(model, ids[:, i:i + 1], past)
        steps.append(lg[0])
    t.compare(case, "cached step logits == full forward", torch.cat(steps).numpy(), full.numpy())
    n = 8
    got = greedy(model, ids[:, :4], n)[0].tolist()
    want = ids[0, :4].tolist()
    for _ in range(n):
        want.append(int(logits_of(model, torch.tensor([want]))[0][0, -1].argmax()))
    t.record(case, "greedy generate (cache) == argmax of full", got == want, f"{got[4:]}")


def check_generate_from_embeddings(t, case, model, tokens):
    """generate(inputs_embeds=...) continues as generate(input_ids) does (the cache then holds more
    positions than input_ids, which holds the generated tokens only)."""
    ids = torch.tensor([tokens[:5]])
    want = greedy(model, ids, 6)[0, 5:].tolist()
    try:
        got = model.generate(inputs_embeds=model.get_input_embeddings()(ids), attention_mask=torch.ones_like(ids),
                             max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0,
                             eos_token_id=None)[0].tolist()
        t.record(case, "generate(inputs_embeds) == generate(input_ids)", got[-6:] == want, f"{got[-6:]} vs {want}")
    except Exception as e:  # noqa: BLE001
        t.record(case, "generate(inputs_embeds) runs", False, f"{type(e).__name__}: {e}"[:40])


def check_foreign_cache(t, case, model, tokens):
    """generate() given a filled cache of another kind refuses it (the shift needs the raw k/v tails,
    which only a KvShiftCache holds) instead of dropping it with the prompt tokens it stands for."""
    cfg = model.config
    foreign = transformers.DynamicCache()
    kv = torch.zeros(1, cfg.num_key_value_heads, 2, cfg.hidden_size // cfg.num_attention_heads)
    for layer in range(cfg.num_hidden_layers):
        foreign.update(kv, kv, layer)
    ids = torch.tensor([tokens[:4]])
    try:
        model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=foreign, max_new_tokens=2,
                       do_sample=False, pad_token_id=0, eos_token_id=None)
        ok, detail = False, "generate() ran with it"
    except ValueError as e:
        ok, detail = "keeps its own cache" in str(e), str(e)
    t.record(case, "generate() refuses a filled foreign cache", ok, detail)


@torch.no_grad()
def check_missing_parameters(t, case, out, drop):
    """Parameters a checkpoint lacks get kvshift's initialisation (norms 1, shifts the paper's: rows
    of U(0, 1) older columns and a current one making the sum 1; sigmoid_gate [0, logit]), the same
    distribution from every load; loaded parameters, in the same modules too, keep their values.
    (transformers 5.x builds the model on the meta device: what _init_weights skipped was left as
    uninitialised memory, different at every load.)"""
    d = out + "_missing"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(out, d)
    w = read_safetensors(os.path.join(out, "model.safetensors"))
    write_st(os.path.join(d, "model.safetensors"),
             {k: ("F32", v) for k, v in w.items() if k not in drop}, {"format": "pt"})
    full = dict(load_export(out).named_parameters())
    gate = json.load(open(os.path.join(out, "config.json")))["kv_shift"].get("parametrization") == "sigmoid_gate"
    for load in range(2):
        got = {k: v.detach() for k, v in load_export(d).named_parameters()}
        bad = [k for k in full if k not in drop and not torch.equal(got[k], full[k].detach())]
        for k in drop:
            v = got[k].double()
            if k.endswith("norm.weight"):
                ok = bool((v == 1).all())
            elif gate:
                ok = bool((v[:, 0] == 0).all()) and bool(torch.isfinite(v).all()) and v[:, 1].abs().max() < 10
            else:
                ok = bool(((v[:, :-1] >= 0) & (v[:, :-1] <= 1)).all()) and \
                    bool(torch.allclose(v.sum(dim=1), torch.ones(v.shape[0], dtype=v.dtype), atol=1e-6))
            if not ok:
                bad.append(f"{k}={v.flatten()[:4].tolist()}")
        t.record(case, f"missing {len(drop)} parameters: kvshift's init, the rest kept (load {load + 1})", not bad,
                 f"{bad[:2]}"[:40])


@torch.no_grad()
def check_hidden_states_and_attentions(t, case, model, tokens):
    """output_hidden_states / output_attentions as transformers' Llama gives them: every layer's input
    and the final normed state (lm_head of the last is the logits), each layer's softmax weights."""
    ids = torch.tensor([tokens])
    o = model(input_ids=ids, output_hidden_states=True, output_attentions=True)
    L, T = model.config.num_hidden_layers, len(tokens)
    hs, att = o.hidden_states, o.attentions
    ok = hs is not None and len(hs) == L + 1 and att is not None and len(att) == L
    ok = ok and torch.equal(hs[0], model.get_input_embeddings()(ids))
    ok = ok and torch.allclose(model.lm_head(hs[-1]).float(), o.logits, rtol=0, atol=1e-6)
    ok = ok and all(a.shape == (1, model.config.num_attention_heads, T, T) for a in att)
    ok = ok and all(torch.allclose(a.sum(-1), torch.ones(()), atol=1e-5) and bool((a.triu(1) == 0).all())
                    for a in att)
    t.record(case, "output_hidden_states / output_attentions", bool(ok),
             f"{None if hs is None else len(hs)} states, {None if att is None else len(att)} attentions")
    # AutoModel: the decoder stack alone, the CausalLM's last hidden state, its cache stepping as the full forward.
    base = transformers.AutoModel.from_pretrained(model.name_or_path, trust_remote_code=True,
                                                  **{DTYPE_ARG: torch.float32}).eval()
    b = base(input_ids=ids, output_hidden_states=True)
    first = base(input_ids=ids[:, :5], use_cache=True)
    past = first.cache if "cache" in first.__dataclass_fields__ else first.past_key_values
    rest = base(input_ids=ids[:, 5:], use_cache=True, **{CACHE_ARG: past})
    # A fresh CausalLM (this one went through bf16 above), without attention weights: sdpa on 5.x as the base.
    same_impl = load_export(model.name_or_path)(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    ok = type(base).__name__ == "KvShiftLlamaModel" and torch.equal(b.last_hidden_state, same_impl) \
        and len(b.hidden_states) == L + 1 and \
        torch.allclose(torch.cat([first.last_hidden_state, rest.last_hidden_state], 1), b.last_hidden_state, atol=1e-5)
    t.record(case, "AutoModel: last_hidden_state and its cache", bool(ok), type(base).__name__)
    g = model.generate(ids[:, :4], attention_mask=torch.ones_like(ids[:, :4]), max_new_tokens=2, do_sample=False,
                       pad_token_id=0, eos_token_id=None, output_hidden_states=True, return_dict_in_generate=True)
    ok = len(g.hidden_states) == 2 and all(len(step) == L + 1 for step in g.hidden_states)
    t.record(case, "generate(output_hidden_states=True) returns them", ok)


@torch.no_grad()
def check_sdpa(t, case, out, tokens):
    """attn_implementation "sdpa" (the default on 5.x) and "eager" give the same logits, also for a
    left-padded batch (whose fully masked rows must stay finite)."""
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention") or MAJOR < 5:
        return t.skip(case, "sdpa: torch 2 and transformers 5 (this line loads eager)")
    models = {impl: AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, attn_implementation=impl,
                                                         **{DTYPE_ARG: torch.float32}).eval()
              for impl in ("eager", "sdpa")}
    default = load_export(out).config._attn_implementation
    t.record(case, "attn_implementation sdpa is the default", default == "sdpa", default)
    ids = torch.tensor([[0, 0] + tokens[:7], tokens[2:11]])
    mask = torch.tensor([[0, 0] + [1] * 7, [1] * 9])
    lg = {impl: m(input_ids=ids, attention_mask=mask).logits for impl, m in models.items()}
    t.record(case, "sdpa logits finite (padded rows too)", bool(torch.isfinite(lg["sdpa"]).all()))
    t.compare(case, "sdpa logits == eager (left-padded batch)", lg["sdpa"][0, 2:].numpy(), lg["eager"][0, 2:].numpy())
    t.compare(case, "sdpa logits == eager (full row)", lg["sdpa"][1].numpy(), lg["eager"][1].numpy())


def check_gradient_checkpointing(t, case, model, tokens):
    """gradient_checkpointing_enable(): the same loss and gradients, each layer recomputed."""
    ids = torch.tensor([tokens])
    model.train()

    def grads():
        model.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.item(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    try:
        plain = grads()
        # 5.x's name (the old one deprecated there), 4.x's.
        name = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
        getattr(model, f"{name}_checkpointing_enable")()
        ckpt = grads()
        getattr(model, f"{name}_checkpointing_disable")()
        worst = max(float((ckpt[1][k] - g).abs().max()) for k, g in plain[1].items())
        ok = ckpt[0] == plain[0] and sorted(ckpt[1]) == sorted(plain[1]) and worst < 1e-6
        t.record(case, "gradient checkpointing: same loss and gradients", ok, f"max diff {worst:.1e}")
    except Exception as e:  # noqa: BLE001
        t.record(case, "gradient checkpointing runs", False, f"{type(e).__name__}: {e}"[:40])
    model.zero_grad()
    model.eval()


def check_generator(t, case, binary, ckpt, model, tokens):
    """`kvshift generate` (greedy, its own KV cache) == the export's greedy generate()."""
    r = run([binary, "generate", "--checkpoint", ckpt, "--prompt-ids", ",".join(map(str, tokens[:4])),
             "--max-new-tokens", "8", "--temperature", "0", "--json"])
    ours = json.loads(r.stdout.strip().splitlines()[-1])["ids"]
    theirs = greedy(model, torch.tensor([tokens[:4]]), 8)[0, 4:].tolist()
    t.record(case, "kvshift generate == exported greedy generate", ours == theirs, f"{ours}")


def padded_logits(model, ids, mask, past=None):
    if HF:
        o = model(input_ids=ids, attention_mask=mask, use_cache=True, **{CACHE_ARG: past})
        return o.logits.float(), o.cache if "cache" in o.__dataclass_fields__ else o.past_key_values
    lg, past = model(ids, past, mask)
    return lg.float(), past


@torch.no_grad()
def check_padding_logits(t, case, model, tokens):
    """Both modes: a left-padded row's logits equal the row alone, in one forward and with the cache
    (prefill, then one token at a time). The pad positions' k and v must not reach the first real
    token's shift (KV shifting reads the previous position, which is padding there)."""
    a = tokens[:7]
    alone = logits_of(model, torch.tensor([a]))[0][0]
    ids = torch.tensor([[0, 0] + a])
    mask = torch.tensor([[0, 0] + [1] * len(a)])
    t.compare(case, "left-padded row logits == row alone", padded_logits(model, ids, mask)[0][0, 2:].numpy(),
              alone.numpy())
    lg, past = padded_logits(model, ids[:, :5], mask[:, :5])
    steps = [lg[0, 2:]]
    for i in range(5, ids.shape[1]):
        lg, past = padded_logits(model, ids[:, i:i + 1], mask[:, :i + 1], past)
        steps.append(lg[0])
    t.compare(case, "left-padded row, cached steps == row alone", torch.cat(steps).numpy(), alone.numpy())


def check_padding_and_half(t, case, model, tokens):
    """Padding logits in both modes; transformers only: left-padded batch generation equals each row
    alone, beam search reorders the cache right, and bf16 runs."""
    check_padding_logits(t, case, model, tokens)
    if not HF:
        return t.skip(case, "generate() with padding and beams, bf16: need transformers")
    a, b = tokens[:5], tokens[2:9]
    ids = torch.tensor([[0, 0] + a, b])
    mask = torch.tensor([[0, 0] + [1] * len(a), [1] * len(b)])
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0,
                           eos_token_id=None)
    alone = [greedy(model, torch.tensor([r]), 5)[0].tolist() for r in (a, b)]
    t.record(case, "left-padded batch generate == rows alone",
             batch[0, 2:].tolist() == alone[0] and batch[1].tolist() == alone[1])
    ids = torch.tensor([tokens[:6], tokens[3:9]])
    beams = [model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=3, num_return_sequences=2,
                            max_new_tokens=6, min_new_tokens=6, do_sample=False, use_cache=c, pad_token_id=0,
                            eos_token_id=None).tolist() for c in (True, False)]
    t.record(case, "beam search with cache == without", beams[0] == beams[1], f"{beams[0][0][6:]}")
    half = model.to(torch.bfloat16)
    out = greedy(half, torch.tensor([tokens]), 3)
    t.record(case, "bf16 model generates", out.shape[1] == len(tokens) + 3)
    model.to(torch.float32)


def export(binary, ckpt, out, *extra):
    shutil.rmtree(out, ignore_errors=True)
    return run([binary, "export-hf", "--checkpoint", ckpt, "--out", out, *extra])


def check_export_files(t, case, out, shifted):
    cfg = json.load(open(os.path.join(out, "config.json")))
    if shifted:
        ok = cfg["model_type"] == "kvshift_llama" and "auto_map" in cfg and all(
            open(os.path.join(out, f)).read() == open(os.path.join(REPO, "python", "hf", f)).read() for f in PY_FILES)
        t.record(case, "config kvshift_llama + auto_map + .py files", ok)
    else:
        ok = cfg["model_type"] == "llama" and "auto_map" not in cfg and "kv_shift" not in cfg and not any(
            f.endswith(".py") for f in os.listdir(out))
        t.record(case, "config plain llama, no remote code", ok)


# Llama 3 RoPE with a context such that, at head_dim 8 and theta 500000, one frequency keeps its value,
# one is blended and two are divided by the factor.
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}

# name, config, seed; all from the oracle's config maker
CASES = [
    ("vanilla_gqa", make_config(32, 4, 2, 40, 2, 37, False, False), 201),
    ("shift_gqa", make_config(32, 4, 2, 40, 2, 37, False, True, theta=500000.0), 202),
    ("shift_tied_mha", make_config(24, 3, 3, 40, 1, 37, True, True, eps=1e-6), 203),
    ("window2_v_only", make_config(16, 2, 1, 40, 1, 37, False, True, window=2, shift_k=False), 204),
    ("gate_qkv", make_config(32, 4, 2, 40, 2, 37, False, True, shift_q=True, parametrization="sigmoid_gate"), 205),
    ("window3_qkv", make_config(32, 4, 1, 40, 1, 37, False, True, window=3, shift_q=True), 206),
    ("nope_shift", make_config(32, 4, 2, 40, 1, 37, False, True, position_encoding="none"), 207),
    ("llama3_shift_gqa", dict(make_config(32, 4, 2, 40, 2, 37, False, True, theta=500000.0), rope_scaling=LLAMA3),
     208),
    ("llama3_vanilla_tied", dict(make_config(32, 4, 2, 40, 1, 37, True, False, theta=500000.0), rope_scaling=LLAMA3),
     209),
]
TOKENS = [0, 5, 9, 5, 9, 33, 1, 5, 36, 12, 7, 5, 9]


def export_cases(t, binary, work):
    vanilla_dirs = None
    for name, cfg, seed in CASES:
        d = os.path.join(work, name)
        shutil.rmtree(d, ignore_errors=True)
        ckpt = os.path.join(d, "ckpt")
        write_checkpoint(ckpt, cfg, draw_weights(cfg, seed))
        want = kvshift_logits(binary, ckpt, TOKENS, d)
        out = os.path.join(d, "hf")
        export(binary, ckpt, out, "--dtype", "fp32")
        shifted = cfg["kv_shift"]["enabled"] or cfg.get("position_encoding") == "none"
        if "rope_scaling" in cfg:
            hf_cfg = json.load(open(os.path.join(out, "config.json")))
            t.record(name, "config: rope_scaling (4.x) and rope_parameters (5.x)",
                     hf_cfg["rope_scaling"] == LLAMA3 and hf_cfg["rope_parameters"] == dict(LLAMA3, rope_theta=500000.0))
        check_export_files(t, name, out, shifted)
        model = load_export(out)
        if HF and not shifted:
            t.record(name, "loads as transformers' LlamaForCausalLM", type(model) is transformers.LlamaForCausalLM,
                     type(model).__name__)
        t.compare(name, "logits == kvshift forward", logits_of(model, torch.tensor([TOKENS]))[0][0].numpy(), want)
        check_cache(t, name, model, TOKENS)
        check_generator(t, name, binary, ckpt, model, TOKENS)
        if name in ("shift_gqa", "window3_qkv", "llama3_shift_gqa"):
            check_padding_and_half(t, name, model, TOKENS)
        if HF and shifted and name == "shift_gqa":
            check_foreign_cache(t, name, model, TOKENS)
            check_generate_from_embeddings(t, name, model, TOKENS)
            check_hidden_states_and_attentions(t, name, model, TOKENS)
            check_sdpa(t, name, out, TOKENS)
            check_gradient_checkpointing(t, name, model, TOKENS)
            check_missing_parameters(t, name, out, ["model.norm.weight", "model.layers.1.self_attn.k_shift"])
        if HF and name in ("gate_qkv", "window3_qkv"):
            check_missing_parameters(t, name, out, ["model.layers.0.self_attn.q_shift",
                                                    "model.layers.0.input_layernorm.weight"])
        back = os.path.join(d, "reimported")
        run([binary, "import-hf", "--model", out, "--out", back])
        a = read_safetensors(os.path.join(back, "model.safetensors"))
        b = read_safetensors(os.path.join(ckpt, "model.safetensors"))  # written by numpy: compare tensors, not files
        same = sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)
        t.record(name, "import(export(ckpt)) tensors bit for bit", same)
        # ... and its config: the same logits (position encoding, theta, scaling, shift settings all count).
        t.record(name, "import(export(ckpt)) logits bit for bit",
                 np.array_equal(kvshift_logits(binary, back, TOKENS, d), want))
        if name == "vanilla_gqa":
            vanilla_dirs = (ckpt, out, want)
    return vanilla_dirs


def trained_case(t, binary, work):
    """A checkpoint from `kvshift train`: bf16 and sharded exports, exact config round trip."""
    d = os.path.join(work, "trained")
    shutil.rmtree(d, ignore_errors=True)
    run([binary, "train", "--config", os.path.join(REPO, "configs", "toy", "induction-1l-kvshift.json"),
         "--set", "train.steps=3", "--set", "train.micro_batch_size=2", "--set", "train.seq_len=16",
         "--set", "train.eval_sequences=2", "--set", "train.eval_every=0", "--set", "model.num_key_value_heads=2",
         "--run-dir", os.path.join(d, "run"), "--quiet"])
    run_dir = os.path.join(d, "run")
    ckpt = os.path.join(run_dir, "checkpoints", open(os.path.join(run_dir, "checkpoints", "latest")).read().strip())
    want = kvshift_logits(binary, ckpt, TOKENS, d)
    # bf16 (the default dtype): loads and stays close; the run names no tokenizer -> a warning
    out = os.path.join(d, "hf_bf16")
    r = export(binary, run_dir, out)
    t.record("trained", "no-tokenizer warning, no tokenizer files",
             "tokenizer" in r.stderr and not os.path.exists(os.path.join(out, "tokenizer_config.json")),
             r.stderr.strip().splitlines()[-1][:40] if r.stderr.strip() else "")
    cfg = json.load(open(os.path.join(out, "config.json")))
    t.record("trained", "bf16 export: torch_dtype bfloat16", cfg.get("torch_dtype") == "bfloat16")
    # Its own (rounded) weights, imported back: the fp32 computation is exact, the bf16 one within bf16 rounding.
    rounded = os.path.join(d, "bf16_reimported")
    run([binary, "import-hf", "--model", out, "--out", rounded])
    want_rounded = kvshift_logits(binary, rounded, TOKENS, d)
    t.compare("trained", "bf16 weights, fp32 compute == kvshift forward",
              logits_of(load_export(out, torch.float32), torch.tensor([TOKENS]))[0][0].numpy(), want_rounded)
    t.compare("trained", "bf16 weights, bf16 compute ~ kvshift forward (2e-2)",
              logits_of(load_export(out, torch.bfloat16), torch.tensor([TOKENS]))[0][0].numpy(), want_rounded,
              tol=2e-2)
    t.compare("trained", "bf16 export ~ the fp32 checkpoint (2e-2)",
              logits_of(load_export(out), torch.tensor([TOKENS]))[0][0].numpy(), want, tol=2e-2)
    # sharded fp32
    out = os.path.join(d, "hf_sharded")
    export(binary, ckpt, out, "--dtype", "fp32", "--max-shard-size", "40KB")
    index = os.path.join(out, "model.safetensors.index.json")
    shards = sorted(f for f in os.listdir(out) if f.startswith("model-") and f.endswith(".safetensors"))
    t.record("trained", "sharded: index + shards", os.path.exists(index) and len(shards) > 1, f"{len(shards)} shards")
    model = load_export(out)
    t.compare("trained", "sharded logits == kvshift forward", logits_of(model, torch.tensor([TOKENS]))[0][0].numpy(),
              want)
    check_cache(t, "trained", model, TOKENS)
    back = os.path.join(d, "reimported")
    run([binary, "import-hf", "--model", out, "--out", back])
    for f in ("model.safetensors", "config.json"):
        t.record("trained", f"import(export) {f} bit for bit",
                 open(os.path.join(back, f), "rb").read() == open(os.path.join(ckpt, f), "rb").read())


def write_st(path, tensors, metadata=None):
    """safetensors with explicit dtypes: {name: (dtype, np array)} (F16 / I32 inputs for import);
    transformers 4.x loads only files whose metadata says {"format": "pt"}."""
    header, blobs, off = ({"__metadata__": metadata} if metadata else {}), [], 0
    for name, (dt, arr) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def import_cases(t, binary, work, vanilla):
    ckpt, hf_dir, vanilla_logits = vanilla
    d = os.path.join(work, "import")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    # A HF-layout Llama in F16 with a stray rotary buffer, as older checkpoints have.
    src = os.path.join(d, "llama_f16")
    os.makedirs(src)
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    json.dump(cfg, open(os.path.join(src, "config.json"), "w"))
    weights = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    f16 = {n: ("F16", w.astype(np.float16)) for n, w in weights.items()}
    f16["model.layers.0.self_attn.rotary_emb.inv_freq"] = ("F32", np.ones(4, np.float32))
    write_st(os.path.join(src, "model.safetensors"), f16)
    ref = os.path.join(d, "ref")
    run([binary, "import-hf", "--model", src, "--out", ref])
    ref_logits = kvshift_logits(binary, ref, TOKENS, d)
    t.compare("import", "F16 import ~ fp32 vanilla logits (1e-2)", ref_logits, vanilla_logits, tol=1e-2)
    ident = os.path.join(d, "identity")
    r = run([binary, "import-hf", "--model", src, "--out", ident, "--kv-shift-init", "identity"])
    t.compare("import", "identity shift == vanilla logits", kvshift_logits(binary, ident, TOKENS, d), ref_logits,
              tol=1e-6)
    for window in (2, 3):  # the identity is the current position's column, the last of W + 1
        ident = os.path.join(d, f"identity_w{window}")
        run([binary, "import-hf", "--model", src, "--out", ident, "--kv-shift-init", "identity", "--window",
             str(window)])
        w = read_safetensors(os.path.join(ident, "model.safetensors"))
        rows = [w[n] for n in w if n.endswith(("k_shift", "v_shift"))]
        want = np.eye(1, window + 1, window)[0]
        t.record("import", f"identity window {window}: every row is [0..0, 1]",
                 len(rows) > 0 and all(r.shape[1] == window + 1 and (r == want).all() for r in rows),
                 np.array2string(rows[0][0]) if rows else "no shift tensors")
        t.compare("import", f"identity window {window} == vanilla logits", kvshift_logits(binary, ident, TOKENS, d),
                  ref_logits, tol=1e-6)
    paper = os.path.join(d, "paper")
    run([binary, "import-hf", "--model", src, "--out", paper, "--kv-shift-init", "paper", "--window", "2"])
    w = read_safetensors(os.path.join(paper, "model.safetensors"))["model.layers.0.self_attn.k_shift"]
    ok = w.shape == (2, 3) and np.allclose(w.sum(1), 1.0, atol=1e-6) and (w[:, :2] >= 0).all() and \
        (w[:, :2] <= 1).all() and not np.allclose(w[:, :2], 0)
    t.record("import", "paper init: older ~ U(0,1), rows sum to 1", ok, np.array2string(w[0], precision=3))
    if HF:  # a checkpoint written by transformers itself
        tf = os.path.join(d, "from_transformers")
        transformers.LlamaForCausalLM.from_pretrained(hf_dir).save_pretrained(tf, safe_serialization=True)
        out = os.path.join(d, "tf_imported")
        run([binary, "import-hf", "--model", tf, "--out", out])
        t.compare("import", "transformers save_pretrained -> import", kvshift_logits(binary, out, TOKENS, d),
                  vanilla_logits)
    return src


def llama_config(theta, llama3, **shape):
    """A LlamaConfig in the running line's dialect: rope_parameters (5.x) or rope_theta + rope_scaling (4.x)."""
    if MAJOR >= 5:
        rope = dict(llama3 or {"rope_type": "default"}, rope_theta=theta)
        return transformers.LlamaConfig(rope_parameters=rope, **shape)
    return transformers.LlamaConfig(rope_theta=theta, rope_scaling=dict(llama3) if llama3 else None, **shape)


def rope_cases(t, binary, work):
    """transformers only: RoPE against transformers' own code, and Llamas saved by it, imported."""
    if not HF:
        return t.skip("rope", "transformers' RoPE and save_pretrained need transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    shape = dict(hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=37, max_position_embeddings=64)
    l32 = dict(LLAMA3, factor=32.0, original_max_position_embeddings=8192)  # Llama 3.2's
    for name, theta, llama3 in (("default", 500000.0, None), ("llama3", 500000.0, LLAMA3),
                                ("llama3.2", 500000.0, l32)):
        cfg = llama_config(theta, llama3, **dict(shape, hidden_size=512, num_attention_heads=4))  # head_dim 128
        theirs = LlamaRotaryEmbedding(config=cfg).inv_freq  # what LlamaForCausalLM rotates with
        ours = kc.rope_inv_freq(128, *kc.rope_settings(cfg))
        t.record("rope", f"{name}: inv_freq == transformers' (bitwise)", torch.equal(theirs, ours),
                 f"max diff {float((theirs - ours).abs().max()):.1e}")

    ids = torch.tensor([[(i * 7 + 3) % 37 for i in range(48)]])
    for name, llama3 in (("theta5e5", None), ("llama3", LLAMA3)):
        d = os.path.join(work, "saved_by_transformers", name)
        shutil.rmtree(d, ignore_errors=True)
        torch.manual_seed(7)
        eos = [2, 3] if llama3 else 2  # Llama 3 lists two
        model = transformers.LlamaForCausalLM(llama_config(500000.0, llama3, initializer_range=0.3, eos_token_id=eos,
                                                           **shape)).eval()
        model.save_pretrained(os.path.join(d, "hf"), safe_serialization=True)
        saved = json.load(open(os.path.join(d, "hf", "config.json")))
        dialect = "rope_parameters" if "rope_parameters" in saved else "rope_theta/rope_scaling"
        with torch.no_grad():
            theirs = model(ids).logits[0].numpy()
        ckpt = os.path.join(d, "imported")
        run([binary, "import-hf", "--model", os.path.join(d, "hf"), "--out", ckpt])
        t.compare("rope", f"{name}: saved ({dialect}) -> import == transformers",
                  kvshift_logits(binary, ckpt, ids[0].tolist(), d), theirs)
        kept = json.load(open(os.path.join(ckpt, "config.json"))).get("eos_token_id")
        t.record("rope", f"{name}: import keeps eos_token_id {eos} (generate stops at it without a tokenizer)",
                 kept == eos, str(kept))
        # ... and an export of that import (no tokenizer) gives it back to transformers, and its import the same config.json.
        exported, back = os.path.join(d, "exported"), os.path.join(d, "reimported")
        export(binary, ckpt, exported, "--dtype", "fp32")
        ex_cfg = json.load(open(os.path.join(exported, "config.json")))
        ex_gen = json.load(open(os.path.join(exported, "generation_config.json")))
        run([binary, "import-hf", "--model", exported, "--out", back])
        same = json.load(open(os.path.join(back, "config.json"))) == json.load(open(os.path.join(ckpt, "config.json")))
        t.record("rope", f"{name}: export keeps eos_token_id {eos} (config.json, generation_config.json); "
                 "import(export) is the same config.json",
                 ex_cfg.get("eos_token_id") == eos and ex_gen.get("eos_token_id") == eos and same,
                 f"config {ex_cfg.get('eos_token_id')}, generation {ex_gen.get('eos_token_id')}, same {same}")
        if llama3:  # the continued-pretraining path: add the shift (identity), export, load, same function
            shifted = os.path.join(d, "shifted")
            run([binary, "import-hf", "--model", os.path.join(d, "hf"), "--out", shifted, "--kv-shift-init",
                 "identity"])
            out = os.path.join(d, "shifted_hf")
            export(binary, shifted, out, "--dtype", "fp32")
            t.compare("rope", f"{name}: + identity shift -> export == transformers",
                      logits_of(load_export(out), ids)[0][0].numpy(), theirs)


def expect_error(t, name, cmd, needle, out=None):
    r = run(cmd, check=False)
    lines = r.stderr.strip().splitlines()
    ok = r.returncode == 1 and len(lines) == 1 and lines[0].startswith("kvshift: error:") and needle in lines[0]
    if out is not None:
        parent = os.path.dirname(os.path.abspath(out))
        ok = ok and not os.path.exists(out) and not any(".tmp." in f for f in os.listdir(parent))
    t.record("errors", name, ok, (lines[-1] if lines else "")[-40:])
    if not ok:
        print("  stderr:", r.stderr.strip()[-500:])


def error_cases(t, binary, work, vanilla, src):
    ckpt, hf_dir, _ = vanilla
    d = os.path.join(work, "errors")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    new = os.path.join(d, "out")
    busy = os.path.join(d, "busy")
    os.makedirs(busy)
    open(os.path.join(busy, "keep.txt"), "w").write("mine\n")
    expect_error(t, "export: non-empty --out without --force",
                 [binary, "export-hf", "--checkpoint", ckpt, "--out", busy], "pass --force")
    expect_error(t, "export: --force over a directory that is no export",
                 [binary, "export-hf", "--checkpoint", ckpt, "--out", busy, "--force"], "holds files but no config.json")
    t.record("errors", "non-empty --out untouched", os.listdir(busy) == ["keep.txt"])
    tokens = os.path.join(d, "tokens.txt")
    open(tokens, "w").write("1 2 3\n")
    expect_error(t, "forward on an export: says it is a Hugging Face directory and how to read it",
                 [binary, "forward", "--checkpoint", hf_dir, "--tokens", tokens, "--out", os.path.join(d, "l.npy")],
                 "a Hugging Face model directory")
    expect_error(t, "export: bad --dtype", [binary, "export-hf", "--checkpoint", ckpt, "--out", new,
                                            "--dtype", "fp16"], "--dtype", out=new)
    expect_error(t, "export: bad --max-shard-size", [binary, "export-hf", "--checkpoint", ckpt, "--out", new,
                                                     "--max-shard-size", "5XB"], "not a size", out=new)
    expect_error(t, "export: --out inside the checkpoint", [binary, "export-hf", "--checkpoint", ckpt, "--out",
                                                            os.path.dirname(ckpt), "--force"], "must not be")

    def broken(name, mutate_cfg=None, mutate_w=None):
        b = os.path.join(d, name)
        os.makedirs(b)
        cfg = json.load(open(os.path.join(src, "config.json")))
        if mutate_cfg:
            mutate_cfg(cfg)
        json.dump(cfg, open(os.path.join(b, "config.json"), "w"))
        w = {n: ("F32", a) for n, a in read_safetensors(os.path.join(hf_dir, "model.safetensors")).items()}
        if mutate_w:
            mutate_w(w)
        write_st(os.path.join(b, "model.safetensors"), w)
        return b

    imp = lambda b: [binary, "import-hf", "--model", b, "--out", new]  # noqa: E731
    b = broken("missing", mutate_w=lambda w: w.pop("model.layers.1.mlp.up_proj.weight"))
    expect_error(t, "import: missing tensor", imp(b), "missing tensor 'model.layers.1.mlp.up_proj.weight'", out=new)
    b = broken("shape", mutate_w=lambda w: w.update({"model.norm.weight": ("F32", np.ones(31, np.float32))}))
    expect_error(t, "import: wrong shape", imp(b), "'model.norm.weight' has shape [31]", out=new)
    b = broken("dtype", mutate_w=lambda w: w.update({"model.norm.weight": ("I32", np.ones(32, np.int32))}))
    expect_error(t, "import: unsupported dtype", imp(b), "dtype I32", out=new)
    b = broken("rope", mutate_cfg=lambda c: c.update(rope_scaling={"type": "linear", "factor": 2.0}))
    expect_error(t, "import: rope_scaling", imp(b), "rope_scaling", out=new)
    b = broken("yarn", mutate_cfg=lambda c: c.update(rope_parameters={"rope_type": "yarn", "factor": 4.0}))
    expect_error(t, "import: rope_parameters yarn", imp(b), 'rope_parameters.rope_type "yarn"', out=new)
    b = broken("theta_disagree", mutate_cfg=lambda c: c.update(rope_theta=10000.0, rope_parameters={
        "rope_type": "default", "rope_theta": 500000.0}))
    expect_error(t, "import: rope_theta != rope_parameters.rope_theta", imp(b), "disagree", out=new)
    b = broken("type_disagree", mutate_cfg=lambda c: c.update(rope_scaling=LLAMA3, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0}))
    expect_error(t, "import: rope_scaling != rope_parameters", imp(b), "describe different RoPE", out=new)
    b = broken("llama3_missing", mutate_cfg=lambda c: c.update(rope_scaling={"rope_type": "llama3", "factor": 8.0}))
    expect_error(t, "import: llama3 without its keys", imp(b), "rope_scaling.low_freq_factor: missing", out=new)
    b = broken("llama3_extra", mutate_cfg=lambda c: c.update(rope_scaling=dict(LLAMA3, mscale=2.0)))
    expect_error(t, "import: llama3 with an unknown key", imp(b), "rope_scaling.mscale 2.0", out=new)
    b = broken("gpt2", mutate_cfg=lambda c: c.update(model_type="gpt2"))
    expect_error(t, "import: not a Llama", imp(b), "gpt2", out=new)
    b = broken("extra", mutate_w=lambda w: w.update({"model.layers.9.foo": ("F32", np.ones(2, np.float32))}))
    expect_error(t, "import: unexpected tensor", imp(b), "unexpected tensor 'model.layers.9.foo'", out=new)
    expect_error(t, "import: shift init on a shifted model",
                 [binary, "import-hf", "--model", os.path.join(work, "shift_gqa", "hf"), "--out", new,
                  "--kv-shift-init", "paper"], "already has KV shift", out=new)


def tokenizer_case(t, binary, work, vanilla):
    try:
        import sentencepiece as spm
    except ImportError:
        return print("tokenizer          skipped: no sentencepiece module", flush=True)
    ckpt = vanilla[0]
    d = os.path.join(work, "tokenizer")
    shutil.rmtree(d, ignore_errors=True)
    tok = os.path.join(d, "tok")
    os.makedirs(tok)
    text = os.path.join(d, "text.txt")
    with open(text, "w") as f:
        for i in range(200):
            f.write(f"the cat {i} sat on the mat and the dog ran after it number {i * 7}\n")
    spm.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(tok, "tokenizer"), vocab_size=37,
                                   model_type="bpe", byte_fallback=False, minloglevel=2,
                                   hard_vocab_limit=False)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(tok, "tokenizer.model"))
    json.dump({"vocab_size": sp.get_piece_size(), "bos_id": sp.bos_id(), "eos_id": sp.eos_id(),
               "unk_id": sp.unk_id(), "pad_id": sp.pad_id(), "sha256": ""},
              open(os.path.join(tok, "kvshift_tokenizer.json"), "w"))
    out = os.path.join(d, "hf")
    export(binary, ckpt, out, "--tokenizer", tok)
    tc = json.load(open(os.path.join(out, "tokenizer_config.json")))
    cfg = json.load(open(os.path.join(out, "config.json")))
    ok = os.path.exists(os.path.join(out, "tokenizer.model")) and tc["add_bos_token"] and not tc["add_eos_token"] \
        and tc["bos_token"] == sp.id_to_piece(sp.bos_id()) and cfg["bos_token_id"] == sp.bos_id() \
        and cfg["eos_token_id"] == sp.eos_id() and os.path.exists(os.path.join(out, "special_tokens_map.json"))
    t.record("tokenizer", "tokenizer files and special ids", ok)
    # import-hf keeps it as a kvshift tokenizer directory: generate decodes with it and export-hf exports it again.
    back, again = os.path.join(d, "imported"), os.path.join(d, "hf_again")
    shutil.rmtree(back, ignore_errors=True)
    run([binary, "import-hf", "--model", out, "--out", back])
    meta = json.load(open(os.path.join(back, "tokenizer", "kvshift_tokenizer.json")))
    g = run([binary, "generate", "--checkpoint", back, "--prompt", "the cat", "--max-new-tokens", "2", "--json"],
            check=False)
    r = export(binary, back, again)
    ok = meta["type"] == "sentencepiece" and meta["vocab_size"] == sp.get_piece_size() and \
        meta["bos_id"] == sp.bos_id() and meta["sha256"] == hashlib.sha256(
            open(os.path.join(out, "tokenizer.model"), "rb").read()).hexdigest() and g.returncode == 0 and \
        open(os.path.join(again, "tokenizer.model"), "rb").read() == open(os.path.join(out, "tokenizer.model"),
                                                                          "rb").read()
    t.record("tokenizer", "import-hf keeps it: generate and export-hf use the imported tokenizer/", ok,
             "" if ok else (g.stderr + r.stderr)[-100:])
    # The tokenizer named by a run config (data.tokenizer), without --tokenizer.
    ck2 = os.path.join(d, "ckpt_with_run_config")
    shutil.copytree(ckpt, ck2)
    json.dump({"data": {"type": "shards", "tokenizer": tok}}, open(os.path.join(ck2, "run_config.json"), "w"))
    out2 = os.path.join(d, "hf_from_run_config")
    r = export(binary, ck2, out2)
    t.record("tokenizer", "run_config data.tokenizer is exported",
             os.path.exists(os.path.join(out2, "tokenizer.model")) and "no tokenizer (" not in r.stderr)
    # sentencepiece's default normalization (nmt_nfkc, extra spaces removed) has no tokenizer.json here:
    # the LlamaTokenizer converts tokenizer.model itself, and a warning says so.
    ok = not os.path.exists(os.path.join(out2, "tokenizer.json")) and tc["tokenizer_class"] == "LlamaTokenizer" \
        and "no tokenizer.json (its normalization is 'nmt_nfkc', not identity)" in r.stderr
    t.record("tokenizer", "an nmt_nfkc tokenizer: no tokenizer.json, a LlamaTokenizer and one warning", ok,
             "" if ok else r.stderr[-100:])
    if HF:
        from transformers import AutoTokenizer
        s = "the cat sat on the mat"
        try:
            got = AutoTokenizer.from_pretrained(out, use_fast=False)(s)["input_ids"]
            want = [sp.bos_id()] + sp.encode(s)
            t.record("tokenizer", "AutoTokenizer ids == [bos] + sentencepiece", got == want, f"{got[:6]}")
        except Exception as e:  # noqa: BLE001
            t.record("tokenizer", "AutoTokenizer loads", False, f"{type(e).__name__}: {e}"[:40])
        kvshift_tokenizer_ids(t, binary, d, text)


def kvshift_tokenizer_ids(t, binary, d, text):
    """A tokenizer trained by kvshift (its sentencepiece settings: spaces kept, byte fallback), exported:
    transformers' tokenizers give the ids sentencepiece gives, the ids kvshift's data were made of, also
    for texts that start with spaces and texts holding "<s>" or "</s>", and decode as sentencepiece does.
    On 4.x the exported tokenizer.json is also compared with transformers' own conversion."""
    import random
    import sentencepiece as spm
    from transformers import AutoTokenizer
    tok = os.path.join(d, "kvshift_tok")
    corpus = os.path.join(d, "kvshift_tok_text.txt")
    rng = random.Random(3)
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "after", "it", "  ", "def", "return", "x", "<s>",
             "über", "naïve", "日本", "語", "\t", "transformers", "tokenizer", "sentencepiece", "merges", "shifting",
             "attention", "ICML", "(", ")", ":", "\u2581", "    return x", "ünïcödé"]
    # Random words and random cuts of them: enough distinct pieces for a few hundred merges.
    lines = [" ".join(w[:rng.randrange(1, len(w) + 1)] if rng.random() < 0.3 else w
                      for w in (rng.choice(words) for _ in range(12))) + f" {i * 7}" for i in range(4000)]
    with open(corpus, "w") as f:
        f.write(open(text).read() + "\n".join(lines) + "\n")
    subprocess.run([binary, "tokenizer", "train", "--input", corpus, "--vocab-size", "600", "--out", tok],
                   check=True, capture_output=True)
    big = os.path.join(d, "ckpt_vocab600")  # a model whose vocabulary holds the tokenizer's 600 pieces
    cfg = make_config(32, 4, 2, 40, 1, 600, False, False)
    write_checkpoint(big, cfg, draw_weights(cfg, 210))
    out = os.path.join(d, "hf_kvshift_tok")
    r = export(binary, big, out, "--tokenizer", tok)
    tc = json.load(open(os.path.join(out, "tokenizer_config.json")))
    ok = os.path.exists(os.path.join(out, "tokenizer.json")) and tc["tokenizer_class"] == "PreTrainedTokenizerFast" \
        and "warning" not in r.stderr
    t.record("tokenizer", "kvshift tokenizer: tokenizer.json, a PreTrainedTokenizerFast, no warning", ok,
             "" if ok else r.stderr[-100:])
    sp = spm.SentencePieceProcessor(model_file=os.path.join(tok, "tokenizer.model"))
    texts = ["the cat sat", "the  cat", "a\nb", "the cat</s>sat", "<s>the dog", "x <s> y", "mat 123", "",
             " the cat", "  two spaces", "\u2581odd", "über naïve 日本語 ☃ 🙂", "tab\there", "   ", "x  ", "<unk> y"]
    for _ in range(300):  # pieces of lines: many start or end with spaces
        a = rng.choice(lines)
        s = rng.randrange(len(a))
        texts.append(a[s:s + rng.randrange(1, 60)])
    for fast in (False, True):
        try:
            hf = AutoTokenizer.from_pretrained(out, use_fast=fast)
            bad = [s for s in texts if hf(s)["input_ids"] != [sp.bos_id()] + sp.encode(s)]
            t.record("tokenizer", f"kvshift tokenizer (use_fast={fast}), {type(hf).__name__}: ids == [bos] + "
                     f"sentencepiece on {len(texts)} texts", not bad, f"differs on {bad[:2]}" if bad else "")
            bad = [s for s in texts if hf.decode(hf(s)["input_ids"], skip_special_tokens=True) != sp.decode(sp.encode(s))]
            t.record("tokenizer", f"kvshift tokenizer (use_fast={fast}): decode == sentencepiece's", not bad,
                     f"differs on {bad[:2]}" if bad else "")
        except Exception as e:  # noqa: BLE001
            t.record("tokenizer", f"kvshift tokenizer loads (use_fast={fast})", False,
                     f"{type(e).__name__}: {e}"[:40])
    exported_snippet_and_padded_vocab(t, binary, d, tok, out)
    shifted_pipeline_and_resave(t, binary, d, tok)
    if MAJOR < 5:  # transformers 4's LlamaConverter: the same file, but for merges into control pieces
        from transformers import LlamaTokenizerFast
        conv = json.loads(LlamaTokenizerFast(vocab_file=os.path.join(out, "tokenizer.model"), legacy=True,
                                             add_prefix_space=True, from_slow=True).backend_tokenizer.to_str())
        ours = json.load(open(os.path.join(out, "tokenizer.json")))
        normal = {sp.id_to_piece(i) for i in range(sp.get_piece_size())
                  if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or sp.is_unused(i))}
        merges = [m if isinstance(m, str) else " ".join(m) for m in conv["model"]["merges"]]
        same = {k: conv[k] == ours[k] for k in ("normalizer", "pre_tokenizer", "decoder", "post_processor")}
        same["model"] = {k: v for k, v in conv["model"].items() if k != "merges"} == \
            {k: v for k, v in ours["model"].items() if k != "merges"}
        same["merges"] = [m for m in merges if m.replace(" ", "") in normal] == ours["model"]["merges"]
        same["added_tokens"] = [(a["id"], a["content"], a["special"]) for a in conv["added_tokens"]] == \
            [(a["id"], a["content"], a["special"]) for a in ours["added_tokens"]]
        t.record("tokenizer", f"tokenizer.json == transformers' conversion ({len(ours['model']['merges'])} merges)",
                 all(same.values()), f"differs in {[k for k, v in same.items() if not v]}")


def shifted_pipeline_and_resave(t, binary, d, tok):
    """A shifted export (remote code) names its tokenizer class in config.json too, so that
    pipeline(model=path) finds the tokenizer on 4.x (it looks there for a model type it does not
    know). After the user's save_pretrained, which writes tokenizer.json but no tokenizer.model,
    import-hf says in one warning that it took no tokenizer."""
    from transformers import AutoTokenizer, pipeline
    ckpt = os.path.join(d, "ckpt_vocab600_shift")
    cfg = make_config(32, 4, 2, 40, 1, 600, False, True)
    write_checkpoint(ckpt, cfg, draw_weights(cfg, 211))
    out = os.path.join(d, "hf_shift_tok")
    export(binary, ckpt, out, "--tokenizer", tok)
    tc = json.load(open(os.path.join(out, "tokenizer_config.json")))
    hf_cfg = json.load(open(os.path.join(out, "config.json")))
    t.record("tokenizer", "config.json names the tokenizer class", hf_cfg.get("tokenizer_class") == tc["tokenizer_class"],
             f"{hf_cfg.get('tokenizer_class')}")
    try:
        pipe = pipeline("text-generation", model=out, trust_remote_code=True)
        text = pipe("the cat", max_new_tokens=3, do_sample=False)[0]["generated_text"]
        t.record("tokenizer", "pipeline(model=shifted export) generates", text.startswith("the cat"), repr(text)[:40])
    except Exception as e:  # noqa: BLE001
        t.record("tokenizer", "pipeline(model=shifted export) generates", False, f"{type(e).__name__}: {e}"[:40])
    resaved, back = os.path.join(d, "hf_shift_resaved"), os.path.join(d, "hf_shift_resaved_imported")
    shutil.rmtree(resaved, ignore_errors=True)
    shutil.rmtree(back, ignore_errors=True)
    load_export(out).save_pretrained(resaved)
    AutoTokenizer.from_pretrained(out, trust_remote_code=True).save_pretrained(resaved)
    if os.path.exists(os.path.join(resaved, "tokenizer.model")):
        return t.record("tokenizer", "save_pretrained drops tokenizer.model (as the import warning assumes)", False)
    r = run([binary, "import-hf", "--model", resaved, "--out", back])
    want = f"{resaved}: tokenizer.json but no tokenizer.model: imported without a tokenizer"
    ok = want in r.stderr and not os.path.exists(os.path.join(back, "tokenizer"))
    t.record("tokenizer", "import-hf of a re-saved export warns that it took no tokenizer", ok,
             "" if ok else r.stderr[-60:])


def exported_snippet_and_padded_vocab(t, binary, d, tok, out):
    """docs/HF.md's "Using an export" as written: tok(text) gives what the model takes (on 4.x a
    PreTrainedTokenizerFast also gave token_type_ids, which generate(**ids) refused). And a vocabulary
    padded past the tokenizer's 600 pieces (640 here, with an lm_head row past them that greedy
    decoding would pick): the export's generate() suppresses those ids as `kvshift generate` skips them."""
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(out)
    model = load_export(out)
    try:
        ids = hf("the cat sat", return_tensors="pt")
        got = model.generate(**ids, max_new_tokens=3, do_sample=False)
        want = greedy(model, ids["input_ids"], 3)
        t.record("tokenizer", "HF.md's snippet: generate(**tok(text)) runs and is greedy", got.tolist() == want.tolist(),
                 f"{got.tolist()} vs {want.tolist()}; keys {sorted(ids.keys())}")
    except Exception as e:  # noqa: BLE001
        t.record("tokenizer", "HF.md's snippet: generate(**tok(text)) runs", False, f"{type(e).__name__}: {e}"[:60])
    padded = os.path.join(d, "ckpt_vocab640")
    cfg = make_config(32, 4, 2, 40, 1, 640, False, False)
    w = draw_weights(cfg, 211)
    write_checkpoint(padded, cfg, w)
    json.dump({"data": {"type": "shards", "tokenizer": tok}}, open(os.path.join(padded, "run_config.json"), "w"))
    prompt = [5, 17, 33, 8]
    first = json.loads(run([binary, "generate", "--checkpoint", padded, "--prompt-ids", ",".join(map(str, prompt)),
                            "--max-new-tokens", "1", "--temperature", "0", "--json"]).stdout.strip().splitlines()[-1])
    w["lm_head.weight"][620] = 3.0 * w["lm_head.weight"][first["ids"][0]]  # its logit 3x the best piece's
    write_checkpoint(padded, cfg, w)
    hf_out = os.path.join(d, "hf_vocab640")
    export(binary, padded, hf_out)
    gen = json.load(open(os.path.join(hf_out, "generation_config.json")))
    ours = json.loads(run([binary, "generate", "--checkpoint", padded, "--prompt-ids", ",".join(map(str, prompt)),
                           "--max-new-tokens", "6", "--temperature", "0", "--json"]).stdout.strip().splitlines()[-1])
    m = load_export(hf_out)
    raw = logits_of(m, torch.tensor([prompt]))[0][0, -1]
    theirs = m.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 4, dtype=torch.long), max_new_tokens=6,
                        min_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)[0, 4:].tolist()
    t.record("tokenizer", "padded vocabulary: generate() suppresses the ids past the tokenizer's, as kvshift "
             "generate skips them", gen.get("suppress_tokens") == list(range(600, 640)) and
             int(raw.argmax()) == 620 and ours["ids"] == theirs and max(theirs) < 600,
             f"kvshift {ours['ids']}, transformers {theirs}, raw argmax {int(raw.argmax())}")


def resolve_checkpoint(path):
    """A step dir, a checkpoints/ dir or a run dir -> the step dir (as kvshift resolves them)."""
    for latest in (os.path.join(path, "checkpoints", "latest"), os.path.join(path, "latest")):
        if os.path.exists(latest):
            return os.path.join(os.path.dirname(latest), open(latest).read().strip())
    return path


def given_case(t, binary, work, path):
    """A checkpoint made elsewhere (scripts/gpu_check.sh passes one trained on the GPU): exported here,
    the export's logits equal `kvshift forward` on the CPU, and `kvshift generate` (CPU) equals the
    export's greedy generate."""
    case = "given"
    ckpt = resolve_checkpoint(path)
    d = os.path.join(work, "given")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    vocab = json.load(open(os.path.join(ckpt, "config.json")))["vocab_size"]
    tokens = [x % vocab for x in TOKENS]
    want = kvshift_logits(binary, ckpt, tokens, d)
    out = os.path.join(d, "hf")
    export(binary, ckpt, out, "--dtype", "fp32")
    model = load_export(out)
    t.compare(case, "logits == kvshift forward (CPU)", logits_of(model, torch.tensor([tokens]))[0][0].numpy(), want)
    check_generator(t, case, binary, ckpt, model, tokens)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvshift", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--stack", choices=["4", "5"], default="4", help="transformers line: 4 (.venv-hf), 5 (.venv-hf5)")
    ap.add_argument("--checkpoint", help="also export this checkpoint (step, checkpoints/ or run dir) and check it "
                    "against `kvshift forward` and `generate` on the CPU")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    torch.set_num_threads(2)
    if HF:
        transformers.logging.set_verbosity_error()
        print(f"mode: transformers {transformers.__version__} ({sys.executable}), torch {torch.__version__}")
    else:
        print(f"mode: pure-torch core (transformers not importable by {sys.executable}; run scripts/setup.sh "
              f"for .venv-hf), torch {torch.__version__}")
    t = Tally()
    try:
        vanilla = export_cases(t, a.kvshift, a.workdir)
        trained_case(t, a.kvshift, a.workdir)
        src = import_cases(t, a.kvshift, a.workdir, vanilla)
        rope_cases(t, a.kvshift, a.workdir)
        error_cases(t, a.kvshift, a.workdir, vanilla, src)
        tokenizer_case(t, a.kvshift, a.workdir, vanilla)
        if a.checkpoint:
            given_case(t, a.kvshift, a.workdir, a.checkpoint)
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        t.record("driver", "ran to the end", False, f"{type(e).__name__}")
    print(f"{t.passed} passed, {t.failed} failed" + (f", {t.skipped} skipped" if t.skipped else ""))
    for f in t.failures:
        print("FAILED:", f)
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
