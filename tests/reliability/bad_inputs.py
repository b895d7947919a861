#!/usr/bin/env python3
"""The bad-input catalogue of docs/RELIABILITY.md, one case per row.

Every case sets up one bad input in a fresh directory, runs the kvshift binary
as a user would, and requires: a non-zero exit within the time limit, exactly
one line starting with "kvshift: error: ", and that line equal to the
catalogue's (with D standing for the case's directory). The test also checks
that docs/RELIABILITY.md lists every case with the same line, so the document
and the code cannot drift apart.

  python3 tests/reliability/bad_inputs.py --kvshift build/kvshift [--only ID] [--print]
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPI_ENV = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none"


def tiny(**train):
    t = {"seq_len": 16, "micro_batch_size": 2, "grad_accum_steps": 1, "steps": 2, "lr": 1e-2, "warmup_steps": 1,
         "eval_every": 0, "eval_sequences": 2, "threads": 1}
    t.update(train)
    return {"name": "bad", "model": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                     "num_attention_heads": 2, "vocab_size": 32, "max_position_embeddings": 16,
                                     "kv_shift": {"enabled": True}},
            "data": {"type": "induction", "induction": {"token_lo": 2, "token_hi": 32, "pool_size": 8}},
            "train": t}


def write(d, name, content, mode="w"):
    p = os.path.join(d, name)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, mode) as f:
        f.write(content)
    return p


def config(d, cfg, name="c.json"):
    return write(d, name, json.dumps(cfg) if isinstance(cfg, dict) else cfg)


def shard(d, name, tokens, token_bytes=2, magic=b"KVSTOKS\0", version=1, count=None, cut=0):
    body = b"".join(struct.pack("<H" if token_bytes == 2 else "<I", t) for t in tokens)
    head = magic + struct.pack("<IIQQ", version, token_bytes, len(tokens) if count is None else count, 0)
    data = head + body
    return write(d, name, data[:len(data) - cut], "wb")


def shard_config(d, **data):
    c = tiny()
    c["data"] = {"type": "shards", "shards": {"train": ["train.bin"], "val": []}}
    c["data"].update(data)
    return config(d, c)


def trained(binary, d, steps=2):
    """A run directory with checkpoints at every step; returns its checkpoints root."""
    cfg = config(d, tiny(steps=steps, checkpoint_every=1), "train.json")
    subprocess.run([binary, "train", "--quiet", "--config", cfg, "--run-dir", os.path.join(d, "run")],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return os.path.join(d, "run", "checkpoints")


def flip(path, from_end=5):
    b = bytearray(open(path, "rb").read())
    b[len(b) - from_end] ^= 0x10
    open(path, "wb").write(bytes(b))


def tokenizer_dir(d, meta):
    t = os.path.join(d, "tok")
    os.makedirs(t, exist_ok=True)
    if meta is not None:
        write(t, "kvshift_tokenizer.json", meta if isinstance(meta, str) else json.dumps(meta))
    return t


def hf_dir(d, cfg=None, tensors=None):
    h = os.path.join(d, "hf")
    os.makedirs(h, exist_ok=True)
    if cfg is not None:
        write(h, "config.json", cfg if isinstance(cfg, str) else json.dumps(cfg))
    if tensors is not None:
        write(h, "model.safetensors", tensors, "wb")
    return h


HF_LLAMA = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 32, "max_position_embeddings": 16}


def safetensors_bytes(header_obj, payload=b""):
    h = json.dumps(header_obj).encode()
    return struct.pack("<Q", len(h)) + h + payload


def llama_tensors(nan_in=None, nan_at=0):
    """model.safetensors of HF_LLAMA (fp32, 0.01 everywhere), element nan_at of tensor nan_in NaN."""
    h, f, v = 16, 32, 32
    shapes = [("model.embed_tokens.weight", [v, h]), ("model.layers.0.input_layernorm.weight", [h])]
    shapes += [("model.layers.0.self_attn.%s_proj.weight" % p, [h, h]) for p in "qkvo"]
    shapes += [("model.layers.0.post_attention_layernorm.weight", [h]), ("model.layers.0.mlp.gate_proj.weight", [f, h]),
               ("model.layers.0.mlp.up_proj.weight", [f, h]), ("model.layers.0.mlp.down_proj.weight", [h, f]),
               ("model.norm.weight", [h]), ("lm_head.weight", [v, h])]
    header, payload = {}, b""
    for name, shape in shapes:
        n = 1
        for s in shape:
            n *= s
        vals = [0.01] * n
        if name == nan_in:
            vals[nan_at] = float("nan")
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(payload), len(payload) + 4 * n]}
        payload += struct.pack("<%df" % n, *vals)
    return safetensors_bytes(header, payload)


# (id, area, what is wrong, setup(binary, d) -> (args, env prefix), the error line)
def cases():
    C = []

    def case(cid, area, what, line):
        def deco(fn):
            C.append((cid, area, what, fn, line))
            return fn
        return deco

    # ---- config ----
    @case("config-missing", "config", "the config file does not exist",
          "D/nope.json: cannot read: No such file or directory")
    def _(b, d):
        return ["train", "--config", os.path.join(d, "nope.json")], ""

    @case("config-not-json", "config", "not JSON (a trailing comma)",
          "D/c.json: invalid JSON at line 1, column 30: syntax error while parsing object key - unexpected '}'; "
          "expected string literal")
    def _(b, d):
        return ["train", "--config", config(d, '{"model": {"hidden_size": 16,}, "x": 1}')], ""

    @case("config-unknown-key", "config", "a misspelt key",
          "D/c.json: unknown key 'train.warmup_step' (did you mean 'train.warmup_steps'?)")
    def _(b, d):
        c = tiny()
        c["train"]["warmup_step"] = 3
        return ["train", "--config", config(d, c)], ""

    @case("config-wrong-type", "config", "a string where a number belongs",
          "D/c.json: train.lr: expected a number, got string \"abc\"")
    def _(b, d):
        c = tiny()
        c["train"]["lr"] = "abc"
        return ["train", "--config", config(d, c)], ""

    @case("config-seed-past-2-53", "config", "a seed written with an exponent past 2^53, where doubles skip integers",
          "D/c.json: train.seed: 1e+16 is past 2^53, where a number with an exponent or a decimal point "
          "is no longer exact: write it in plain digits (10000000000000000)")
    def _(b, d):
        return ["train", "--config", config(d, tiny()), "--set", "train.seed=1e16"], ""

    @case("memory-moments-do-not-fit", "memory", "a model whose AdamW moments do not fit (a 4 GB address-space limit): "
          "refused before the first step", "the AdamW moments of 235163904 parameters (1.75 GiB) do not fit: the "
          "address-space limit (ulimit -v) of 3907 MiB leaves * MiB beside the * MiB the weights, gradients, "
          "activations, libraries and threads already take, and it needs about 1795 MiB more: raise the limit to at "
          "least * MiB (ulimit -v *) or lift it; or lower train.micro_batch_size or train.seq_len, or shard them "
          "(ZeRO-1: more data-parallel processes)")
    def _(b, d):
        c = tiny(steps=1)
        c["model"].update(hidden_size=4096, intermediate_size=4096, num_hidden_layers=2, num_attention_heads=32)
        return ["train", "--config", config(d, c), "--run-dir", os.path.join(d, "run")], "ulimit -v 4000000;"

    @case("memory-address-space-limit", "memory", "activations that fit under the address-space limit (a 3 GB "
          "`ulimit -v`, 61 MiB to spare) but not beside the libraries the process maps first",
          "the model's * GiB of fp32 weights, gradients, AdamW moments and activations of micro-batch 76800 x 16 do "
          "not fit: the address-space limit (ulimit -v) of 2930 MiB leaves * MiB beside the * MiB this process maps "
          "before any model (its libraries and threads), and it needs about * MiB more: raise the limit to at least * "
          "MiB (ulimit -v *) or lift it")
    def _(b, d):
        return ["train", "--config", config(d, tiny(micro_batch_size=76800)), "--run-dir", os.path.join(d, "run")], \
            "ulimit -v 3000000;"

    @case("memory-activations-do-not-fit", "memory", "a micro-batch whose activations do not fit (a 3 GB "
          "address-space limit)", "the model does not fit in memory: 3.63e+03 parameters take 5.41e-05 GiB of fp32 "
          "weights, gradients and AdamW moments, and the activations of micro-batch 262144 x 16 about 9.56 GiB more "
          "(the whole model in one process; `kvshift info --config F` has each rank's); lower "
          "train.micro_batch_size or train.seq_len")
    def _(b, d):
        return ["train", "--config", config(d, tiny(micro_batch_size=262144)), "--run-dir", os.path.join(d, "run")], \
            "ulimit -v 3000000;"

    @case("config-bad-enum", "config", "an unknown schedule",
          "D/c.json: train.schedule: must be \"constant\", \"cosine\", \"linear\" or \"wsd\", got \"exponential\"")
    def _(b, d):
        c = tiny()
        c["train"]["schedule"] = "exponential"
        return ["train", "--config", config(d, c)], ""

    @case("config-duplicate-key", "config", "the same key twice", "D/c.json: duplicate key 'train.lr'")
    def _(b, d):
        return ["train", "--config", config(d, json.dumps(tiny()).replace('"lr": 0.01', '"lr": 0.01, "lr": 0.02'))], ""

    @case("config-missing-model", "config", "no model section", "D/c.json: missing required key 'model'")
    def _(b, d):
        c = tiny()
        del c["model"]
        return ["train", "--config", config(d, c)], ""

    @case("config-seq-too-long", "config", "seq_len beyond max_position_embeddings",
          "D/c.json: train.seq_len: 32 exceeds model.max_position_embeddings (16)")
    def _(b, d):
        return ["train", "--config", config(d, tiny(seq_len=32))], ""

    @case("config-heads-divide", "config", "hidden_size not divisible by the heads",
          "D/c.json: model.hidden_size: 16 is not divisible by model.num_attention_heads (3)")
    def _(b, d):
        c = tiny()
        c["model"]["num_attention_heads"] = 3
        return ["train", "--config", config(d, c)], ""

    @case("config-negative-keep", "config", "a negative train.keep_checkpoints",
          "D/c.json: train.keep_checkpoints: must be >= 0 (0 keeps every checkpoint), got -1")
    def _(b, d):
        return ["train", "--config", config(d, tiny(keep_checkpoints=-1))], ""

    @case("config-stop-signal", "config", "a stop signal that cannot be caught",
          "D/c.json: train.stop_signal: must be \"SIGUSR1\", \"SIGUSR2\", \"SIGHUP\" or \"none\", got \"SIGKILL\"")
    def _(b, d):
        return ["train", "--config", config(d, tiny(stop_signal="SIGKILL"))], ""

    @case("config-nan", "config", "a non-finite number",
          "D/c.json: invalid JSON at line 1, column *: syntax error while parsing value - invalid literal; last "
          "read: '\"lr\": N'")
    def _(b, d):
        return ["train", "--config", config(d, json.dumps(tiny()).replace('"lr": 0.01', '"lr": NaN'))], ""

    @case("config-number-overflow", "config", "a number beyond double's range",
          "D/c.json: invalid JSON: number overflow parsing '1e400'")
    def _(b, d):
        return ["train", "--config", config(d, json.dumps(tiny()).replace('"lr": 0.01', '"lr": 1e400'))], ""

    @case("config-induction-too-short", "config", "an induction task with sequences too short to score anything",
          "D/c.json: train.seq_len: the induction task needs >= 3 positions (A B ... A -> B), got 2")
    def _(b, d):
        return ["train", "--config", config(d, tiny(seq_len=2))], ""

    # ---- command line ----
    @case("cli-bad-override", "CLI", "an override without '='",
          "D/c.json: override 'train.lr': expected KEY.PATH=VALUE (no '=' found)")
    def _(b, d):
        return ["train", "--config", config(d, tiny()), "--set", "train.lr"], ""

    @case("cli-override-unknown", "CLI", "an override of an unknown key",
          "D/c.json: override 'train.lerning_rate=1': unknown key 'train.lerning_rate'")
    def _(b, d):
        return ["train", "--config", config(d, tiny()), "--set", "train.lerning_rate=1"], ""

    @case("cli-resume-nothing", "CLI", "--resume of a run without checkpoints",
          "D/run/checkpoints: --resume given but there is no checkpoint to resume from")
    def _(b, d):
        return ["train", "--config", config(d, tiny()), "--run-dir", os.path.join(d, "run"), "--resume"], ""

    @case("cli-overwrite-run", "CLI", "a new run in a directory with checkpoints",
          "D/run: the run directory already has checkpoints; use --resume or another --run-dir")
    def _(b, d):
        trained(b, d)
        return ["train", "--config", config(d, tiny()), "--run-dir", os.path.join(d, "run")], ""

    @case("cli-empty-run-dir", "CLI", "an empty --run-dir (a variable that was not set)",
          "train: --run-dir: an empty path (kvshift train --help lists its options)")
    def _(b, d):
        return ["train", "--config", config(d, tiny()), "--run-dir", ""], ""

    @case("cli-no-config", "CLI", "train without --config or --resume",
          "train: --config is required (unless --resume with --run-dir)")
    def _(b, d):
        return ["train"], ""

    @case("cli-unknown-option", "CLI", "an option the subcommand does not have",
          "bench: unknown option '--threads' (kvshift bench --help lists its options)")
    def _(b, d):
        return ["bench", "--config", config(d, tiny()), "--threads", "2"], ""

    @case("cli-nested-unknown-option", "CLI", "a misspelt option of a nested subcommand (a required one missing too)",
          "tokenizer encode: unknown option '--txt' (kvshift tokenizer encode --help lists its options)")
    def _(b, d):
        return ["tokenizer", "encode", "--tokenizer", d, "--txt", "hi"], ""

    @case("cli-nested-unknown-subcommand", "CLI", "a nested subcommand kvshift does not have",
          "unknown subcommand 'tokenizer nosuch' (kvshift tokenizer --help lists them)")
    def _(b, d):
        return ["tokenizer", "nosuch"], ""

    @case("cli-device-rules", "CLI", "--device cuda for a model the CUDA kernels cannot run",
          "D/c.json with --device cuda: device: \"cuda\" needs head_dim (hidden_size / num_attention_heads) of 16, "
          "32, 64 or 128, got 8")
    def _(b, d):
        return ["bench", "--config", config(d, tiny()), "--device", "cuda"], ""

    @case("cli-unknown-subcommand", "CLI", "a subcommand kvshift does not have",
          "unknown subcommand 'nosuch' (kvshift --help lists them)")
    def _(b, d):
        return ["nosuch"], ""

    @case("cli-option-first", "CLI", "an option before the subcommand",
          "unknown option '--threads' before the subcommand (kvshift --help lists them)")
    def _(b, d):
        return ["--threads", "2", "bench", "--config", config(d, tiny())], ""

    @case("cli-resume-other-model", "CLI", "--resume with a different model",
          "D/run/checkpoints/step_00000002: the checkpoint's model differs from the config's model section: "
          "model.intermediate_size: 32 vs 64 (checkpoint vs config)")
    def _(b, d):
        trained(b, d)
        c = tiny()
        c["model"]["intermediate_size"] = 64
        return ["train", "--config", config(d, c), "--run-dir", os.path.join(d, "run"), "--resume"], ""

    @case("cli-resume-other-batch", "CLI", "--resume with another global batch",
          "D/run/checkpoints/step_00000002: the global batch changed (checkpoint 2 sequences, config 4); data "
          "positions would not line up")
    def _(b, d):
        trained(b, d)
        return ["train", "--config", config(d, tiny(micro_batch_size=4)), "--run-dir", os.path.join(d, "run"),
                "--resume"], ""

    @case("cli-resume-other-seq-len", "CLI", "--resume with another train.seq_len (the same global batch)",
          "D/run/checkpoints/step_00000002: train.seq_len changed (checkpoint 16, config 8); the data stream would "
          "not line up")
    def _(b, d):
        trained(b, d)
        return ["train", "--config", config(d, tiny(seq_len=8)), "--run-dir", os.path.join(d, "run"), "--resume"], ""

    @case("cli-resume-past-steps", "CLI", "--resume with train.steps below the checkpoint's step",
          "D/run/checkpoints/step_00000002: the checkpoint is at step 2, past train.steps (1); raise train.steps to "
          "train on")
    def _(b, d):
        trained(b, d)
        return ["train", "--config", config(d, tiny(steps=1)), "--run-dir", os.path.join(d, "run"), "--resume"], ""

    @case("cli-run-dir-is-a-checkpoint", "CLI", "a new run with --run-dir where --init-from was meant",
          "D/run/checkpoints/step_00000002: holds model weights (model.safetensors); a run there would overwrite "
          "its config.json: use another --run-dir (--init-from D/run/checkpoints/step_00000002 starts a run from "
          "those weights)")
    def _(b, d):
        ck = os.path.join(trained(b, d), "step_00000002")
        return ["train", "--config", config(d, tiny()), "--run-dir", ck], ""

    @case("cli-run-dir-held", "CLI", "a second trainer on a run directory another process holds (resume)",
          "D/run: another kvshift train is using this run directory; wait for it to end or stop it, or use another "
          "--run-dir")
    def _(b, d):
        run = os.path.dirname(trained(b, d))
        # util-linux flock holds the run directory's lock while kvshift runs (it writes no pid).
        return (["train", "--config", config(d, tiny(steps=4)), "--run-dir", run, "--resume"],
                "flock " + sh_quote(os.path.join(run, ".kvshift.lock")))

    @case("cli-model-too-large", "CLI", "a model larger than the machine's memory",
          "the model does not fit in memory: 1.92e+12 parameters take 2.87e+04 GiB of fp32 weights, gradients and "
          "AdamW moments, and the activations of micro-batch 1 x 16 about 0.879 GiB more (the whole model in one "
          "process; `kvshift info --config F` has each rank's); spread the model over more processes (parallel.tp, "
          "parallel.pp) or make it smaller")
    def _(b, d):
        c = tiny(micro_batch_size=1)
        c["model"].update(hidden_size=524288, intermediate_size=524288, num_attention_heads=4096, vocab_size=32)
        return ["train", "--config", config(d, c), "--run-dir", os.path.join(d, "run")], ""

    @case("cli-eval-set-model", "CLI", "eval with a model override (eval runs the checkpoint's model)",
          "--set model.hidden_size=32: eval runs the checkpoint's model as saved; only data, train and parallel "
          "keys can be overridden")
    def _(b, d):
        return ["eval", "--checkpoint", trained(b, d), "--set", "model.hidden_size=32"], ""

    @case("cli-eval-layout-one-process", "CLI", "eval in one process asked for a tensor-parallel layout",
          "parallel.tp (2) must divide the number of processes (1): the world is dp x tp ranks")
    def _(b, d):
        return ["eval", "--checkpoint", trained(b, d), "--set", "parallel.tp=2"], ""

    @case("cli-forward-too-long", "CLI", "forward on more tokens than the model's positions",
          "D/t.txt: 17 positions exceed the model's max_position_embeddings 16")
    def _(b, d):
        return ["forward", "--checkpoint", trained(b, d), "--tokens", write(d, "t.txt", " ".join(["3"] * 17)),
                "--out", os.path.join(d, "l.npy")], ""

    @case("cli-backward-bad-token", "CLI", "backward on a batch with an input id outside the vocabulary",
          "D/b.safetensors: input token 40 at [1, 2] is outside [0, vocab_size 32)")
    def _(b, d):
        ids = [3] * 8
        ids[6] = 40  # row 1, position 2 of a [2, 4] batch
        i32 = struct.pack("<8i", *ids)
        f32 = struct.pack("<8f", *([1.0] * 8))
        header = {"inputs": {"dtype": "I32", "shape": [2, 4], "data_offsets": [0, 32]},
                  "targets": {"dtype": "I32", "shape": [2, 4], "data_offsets": [32, 64]},
                  "mask": {"dtype": "F32", "shape": [2, 4], "data_offsets": [64, 96]}}
        batch = write(d, "b.safetensors", safetensors_bytes(header, i32 + struct.pack("<8i", *([3] * 8)) + f32), "wb")
        return ["backward", "--checkpoint", trained(b, d), "--batch", batch, "--out", os.path.join(d, "g.st")], ""

    @case("cli-forward-out-into-checkpoint", "CLI", "forward --out into the checkpoint it reads",
          "D/run/checkpoints/step_00000002/model.safetensors: --out must not be (or lie inside) the input "
          "D/run/checkpoints/step_00000002")
    def _(b, d):
        step = os.path.join(trained(b, d), "step_00000002")
        return ["forward", "--checkpoint", step, "--tokens", write(d, "ids.txt", "3 4 5"), "--out",
                os.path.join(step, "model.safetensors")], ""

    @case("cli-backward-inf-mask", "CLI", "backward on a batch whose mask holds an infinity",
          "D/b.safetensors: mask value inf at [0, 1] is not a finite weight >= 0")
    def _(b, d):
        mask = [1.0] * 8
        mask[1] = float("inf")
        header = {"inputs": {"dtype": "I32", "shape": [2, 4], "data_offsets": [0, 32]},
                  "targets": {"dtype": "I32", "shape": [2, 4], "data_offsets": [32, 64]},
                  "mask": {"dtype": "F32", "shape": [2, 4], "data_offsets": [64, 96]}}
        payload = struct.pack("<8i", *([3] * 8)) * 2 + struct.pack("<8f", *mask)
        batch = write(d, "b.safetensors", safetensors_bytes(header, payload), "wb")
        return ["backward", "--checkpoint", trained(b, d), "--batch", batch, "--out", os.path.join(d, "g.st")], ""

    @case("cli-checkpoint-dir-dangling", "CLI", "checkpoints/ links to storage that is not there (before step 1)",
          "D/run/checkpoints: cannot create directory: it is a symbolic link to D/scratch/ck, which does not exist")
    def _(b, d):
        os.makedirs(os.path.join(d, "run"))
        os.symlink(os.path.join(d, "scratch", "ck"), os.path.join(d, "run", "checkpoints"))
        return ["train", "--config", config(d, tiny()), "--run-dir", os.path.join(d, "run")], ""

    @case("cli-resume-task-changed", "CLI", "--resume with another generated task (the induction pool)",
          "D/run/checkpoints/step_00000002: data.induction.pool_size: 8 vs 9 (checkpoint vs config); its data "
          "position would map onto other sequences: restore the checkpoint's setting, or pass --allow-data-change "
          "to go on with this one")
    def _(b, d):
        trained(b, d)
        c = tiny(steps=4)
        c["data"]["induction"]["pool_size"] = 9
        return ["train", "--config", config(d, c), "--run-dir", os.path.join(d, "run"), "--resume"], ""

    @case("cli-resume-no-run-config", "CLI", "--resume from a checkpoint whose run_config.json is gone (seq_len and "
          "the data settings live only there)",
          "D/run/checkpoints/step_00000002/run_config.json is missing: train.seq_len and the data settings cannot be "
          "compared with the checkpoint's; restore it (every checkpoint of the run holds the run's config), or pass "
          "--allow-data-change to go on unchecked")
    def _(b, d):
        trained(b, d)
        os.remove(os.path.join(d, "run", "checkpoints", "step_00000002", "run_config.json"))
        return ["train", "--config", config(d, tiny(steps=4)), "--run-dir", os.path.join(d, "run"), "--resume"], ""

    @case("cli-resume-dangling-latest", "CLI", "a fresh start in a run directory whose step directories were "
          "removed but not its latest",
          "D/run/checkpoints/latest is all that is left of the run's checkpoints (no step directory): remove it to "
          "start a new run in D/run, or restore the checkpoints and use --resume")
    def _(b, d):
        root = trained(b, d)
        for s in os.listdir(root):
            if s.startswith("step_"):
                shutil.rmtree(os.path.join(root, s))
        return ["train", "--config", config(d, tiny(steps=4)), "--run-dir", os.path.join(d, "run")], ""

    @case("cli-dist-check-timeout", "CLI", "dist-check --timeout 0 (it used to mean the default)",
          "dist-check: --timeout: must be a positive number of seconds, got '0' (kvshift dist-check --help lists "
          "its options)")
    def _(b, d):
        return ["dist-check", "--timeout", "0"], ""

    @case("cli-eval-run-config-bad", "CLI", "eval without --config of a checkpoint whose run_config.json was broken",
          "D/run/checkpoints/step_00000002/run_config.json: invalid JSON: parse error at line 1, column 2: syntax "
          "error while parsing object key - invalid literal; last read: '{b'; expected string literal; pass --config")
    def _(b, d):
        write(os.path.join(trained(b, d), "step_00000002"), "run_config.json", "{bad")
        return ["eval", "--checkpoint", os.path.join(d, "run")], ""

    @case("cli-name-escapes-runs", "CLI", "a config name that would put the default run directory outside runs/",
          "D/c.json: name '../x' cannot name a directory under runs/ (no '/', not '.' or '..', at most 255 bytes): change it or pass "
          "--run-dir")
    def _(b, d):
        c = tiny()
        c["name"] = "../x"
        return ["train", "--config", config(d, c)], ""

    @case("cli-eval-checkpoints-file", "CLI", "eval --checkpoint of a run directory whose checkpoints is a file",
          "D/run/checkpoints is not a directory (a run directory keeps its step_* checkpoints there)")
    def _(b, d):
        write(os.path.join(d, "run"), "checkpoints", "not a directory")
        return ["eval", "--checkpoint", os.path.join(d, "run")], ""

    @case("cli-generate-no-checkpoint", "CLI", "generate from a directory that is not a checkpoint",
          "D: missing config.json (not a kvshift checkpoint?)")
    def _(b, d):
        return ["generate", "--checkpoint", d, "--prompt-ids", "1,2"], ""

    # ---- data shards ----
    @case("shard-missing", "data shards", "a shard glob that matches nothing",
          "data.shards.train: no file matches \"D/train.bin\"")
    def _(b, d):
        return ["train", "--config", shard_config(d), "--run-dir", os.path.join(d, "run")], ""

    @case("shard-bad-magic", "data shards", "a file that is not a shard",
          "D/train.bin: not a token shard (bad magic, expected \"KVSTOKS\\0\")")
    def _(b, d):
        shard(d, "train.bin", list(range(2, 30)) * 10, magic=b"NOTSHARD")
        return ["train", "--config", shard_config(d), "--run-dir", os.path.join(d, "run")], ""

    @case("shard-truncated", "data shards", "a shard cut short",
          "D/train.bin: file size 587 does not match the header (280 tokens x 2 bytes + 32 header bytes): truncated "
          "or corrupt shard")
    def _(b, d):
        shard(d, "train.bin", list(range(2, 30)) * 10, cut=5)
        return ["train", "--config", shard_config(d), "--run-dir", os.path.join(d, "run")], ""

    @case("shard-manifest-missing", "data shards", "a shard the manifest lists is missing (a partial copy)",
          "data.shards.train: D/train_1.bin is missing: D/manifest.json lists it (280 tokens) among the shards "
          "\"D/train_*.bin\" matches (a partial copy?)")
    def _(b, d):
        shard(d, "train_0.bin", list(range(2, 30)) * 10)
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump({"splits": {"train": {"shards": [{"file": "train_0.bin", "tokens": 280},
                                                       {"file": "train_1.bin", "tokens": 280}]}}}, f)
        c = tiny()
        c["data"] = {"type": "shards", "shards": {"train": ["train_*.bin"], "val_fraction": 0.1}}
        return ["train", "--config", config(d, c), "--run-dir", os.path.join(d, "run")], ""

    @case("shard-version", "data shards", "a shard of an unknown version",
          "D/train.bin: unsupported shard version 9 (this build reads version 1)")
    def _(b, d):
        shard(d, "train.bin", list(range(2, 30)) * 10, version=9)
        return ["train", "--config", shard_config(d), "--run-dir", os.path.join(d, "run")], ""

    @case("shard-out-of-vocab", "data shards", "a token id beyond the model's vocabulary",
          "D/train.bin: token ID 40 at position * is >= model.vocab_size 32")
    def _(b, d):
        shard(d, "train.bin", [40] * 1200)
        return ["train", "--config", shard_config(d), "--run-dir", os.path.join(d, "run")], ""

    @case("shard-too-short", "data shards", "fewer tokens than one sequence",
          "data.shards.train: 10 training tokens (after the validation split), fewer than one window of "
          "train.seq_len + 1 = 17 tokens")
    def _(b, d):
        shard(d, "train.bin", list(range(2, 12)))
        return ["train", "--config", shard_config(d), "--run-dir", os.path.join(d, "run")], ""

    @case("shard-data-changed", "data shards", "resume after the shard glob matched one more file",
          "D/run/checkpoints/step_00000002: the data changed since this checkpoint (sequences * then, * now); its "
          "data position would map onto other sequences: restore the shards and settings it was trained on, or pass "
          "--allow-data-change to go on with these")
    def _(b, d):
        shard(d, "train_0.bin", list(range(2, 30)) * 20)
        cfg = shard_config(d, shards={"train": ["train_*.bin"], "val": []})
        subprocess.run([b, "train", "--quiet", "--config", cfg, "--run-dir", os.path.join(d, "run")], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shard(d, "train_1.bin", list(range(2, 30)) * 20)
        return ["train", "--config", cfg, "--run-dir", os.path.join(d, "run"), "--resume", "--set",
                "train.steps=3"], ""

    @case("shard-matched-twice", "data shards", "one shard matched by two train patterns",
          "data.shards.train: D/train_0.bin is matched by \"D/train_*.bin\" and by \"D/train_0.bin\": it would be read "
          "twice (to weight a source, give data.shards.weights)")
    def _(b, d):
        shard(d, "train_0.bin", list(range(2, 30)) * 20)
        return ["train", "--config", shard_config(d, shards={"train": ["train_*.bin", "train_0.bin"], "val": []}),
                "--run-dir", os.path.join(d, "run")], ""

    @case("shard-glob-directory", "data shards", "a shard glob that matches a directory",
          "data.shards.train: D/train_x.bin (matched by \"D/train_*.bin\") is not a regular file")
    def _(b, d):
        shard(d, "train_0.bin", list(range(2, 30)) * 20)
        os.makedirs(os.path.join(d, "train_x.bin"))
        return ["train", "--config", shard_config(d, shards={"train": ["train_*.bin"], "val": []}),
                "--run-dir", os.path.join(d, "run")], ""

    @case("shard-blend-weights", "data shards", "fewer weights than blended sources",
          "D/c.json: data.shards.weights: 1 weight for 2 data.shards.train entries (one weight per entry: each entry "
          "is a source)")
    def _(b, d):
        shard(d, "a.bin", list(range(2, 30)) * 20)
        return ["train", "--config", shard_config(d, shards={"train": ["a.bin", "a.bin"], "weights": [1]}),
                "--run-dir", os.path.join(d, "run")], ""

    @case("shard-blend-source-short", "data shards", "a blended source shorter than one sequence",
          "data.shards.train[1]: 10 training tokens (after the validation split), fewer than one window of "
          "train.seq_len + 1 = 17 tokens")
    def _(b, d):
        shard(d, "a.bin", list(range(2, 30)) * 20)
        shard(d, "b.bin", list(range(2, 12)))
        return ["train", "--config", shard_config(d, shards={"train": ["a.bin", "b.bin"], "weights": [3, 1]}),
                "--run-dir", os.path.join(d, "run")], ""

    @case("shard-token-bytes", "data shards", "a token width other than 2 or 4",
          "D/train.bin: bad bytes per token 3 in the shard header (must be 2 or 4)")
    def _(b, d):
        path = shard(d, "train.bin", list(range(2, 30)) * 10)
        data = bytearray(open(path, "rb").read())
        data[12:16] = struct.pack("<I", 3)
        open(path, "wb").write(bytes(data))
        return ["train", "--config", shard_config(d), "--run-dir", os.path.join(d, "run")], ""

    # ---- tokenizer ----
    @case("tokenizer-missing-dir", "tokenizer", "data.tokenizer names no directory",
          "data.tokenizer: D/tok is not a directory (make one with `kvshift tokenizer train`)")
    def _(b, d):
        shard(d, "train.bin", list(range(2, 30)) * 10)
        return ["train", "--config", shard_config(d, tokenizer="tok"), "--run-dir", os.path.join(d, "run")], ""

    @case("tokenizer-no-meta", "tokenizer", "a tokenizer directory without kvshift_tokenizer.json",
          "data.tokenizer: D/tok/kvshift_tokenizer.json: missing; a tokenizer directory is made by `kvshift "
          "tokenizer train`")
    def _(b, d):
        shard(d, "train.bin", list(range(2, 30)) * 10)
        tokenizer_dir(d, None)
        return ["train", "--config", shard_config(d, tokenizer="tok"), "--run-dir", os.path.join(d, "run")], ""

    @case("tokenizer-vocab-too-big", "tokenizer", "a tokenizer larger than the model's vocabulary",
          "data.tokenizer: the tokenizer's vocab_size 256 exceeds model.vocab_size 32 (D/tok)")
    def _(b, d):
        shard(d, "train.bin", list(range(2, 30)) * 10)
        tokenizer_dir(d, {"type": "bytes", "model_type": "", "vocab_size": 256, "bos_id": -1, "eos_id": -1,
                          "unk_id": -1, "pad_id": -1, "sha256": ""})
        return ["train", "--config", shard_config(d, tokenizer="tok"), "--run-dir", os.path.join(d, "run")], ""

    @case("tokenizer-other-kind", "tokenizer", "byte-level data.tokenizer for shards a sentencepiece one made",
          "D/manifest.json: the shards were made with another tokenizer (sentencepiece (sha256 0123456789ab...), "
          "directory not recorded) than data.tokenizer D/tok (bytes): run `kvshift data prepare` again with it, or "
          "point data.tokenizer at the one they were made with")
    def _(b, d):
        shard(d, "train.bin", list(range(2, 30)) * 10)
        write(d, "manifest.json", json.dumps({"tokenizer": {"type": "sentencepiece", "sha256": "0123456789ab" * 5}}))
        tokenizer_dir(d, {"type": "bytes", "vocab_size": 256})
        c = json.loads(open(shard_config(d, tokenizer="tok")).read())
        c["model"]["vocab_size"] = 256
        return ["train", "--config", config(d, c), "--run-dir", os.path.join(d, "run")], ""

    @case("tokenizer-no-bos-for-documents", "tokenizer", "document boundaries over byte-level data (no BOS)",
          "model.bos_token_id (1): data.tokenizer D/tok has no BOS token (byte-level data is not framed in "
          "documents): model.document_boundaries needs \"none\" with it")
    def _(b, d):
        shard(d, "train.bin", list(range(2, 30)) * 10)
        tokenizer_dir(d, {"type": "bytes", "vocab_size": 256})
        c = json.loads(open(shard_config(d, tokenizer="tok")).read())
        c["model"].update({"vocab_size": 256, "document_boundaries": "shift", "bos_token_id": 1})
        return ["train", "--config", config(d, c), "--run-dir", os.path.join(d, "run")], ""

    @case("tokenizer-bad-json", "tokenizer", "kvshift_tokenizer.json is not JSON",
          "data.tokenizer: D/tok/kvshift_tokenizer.json: invalid JSON: parse error at line 1, column 1: syntax "
          "error while parsing value - invalid literal; last read: 'x'")
    def _(b, d):
        shard(d, "train.bin", list(range(2, 30)) * 10)
        tokenizer_dir(d, "x")
        return ["train", "--config", shard_config(d, tokenizer="tok"), "--run-dir", os.path.join(d, "run")], ""

    @case("tokenizer-train-no-input", "tokenizer", "tokenizer train on a missing text file",
          "D/none.txt: cannot read: No such file or directory")
    def _(b, d):
        return ["tokenizer", "train", "--input", os.path.join(d, "none.txt"), "--out", os.path.join(d, "tok"),
                "--vocab-size", "300"], ""

    @case("tokenizer-coverage-range", "tokenizer", "a --character-coverage sentencepiece rejects",
          "--character-coverage must be in [0.98, 1] (got 2)")
    def _(b, d):
        return ["tokenizer", "train", "--input", write(d, "corpus.txt", "some text\n"), "--out",
                os.path.join(d, "tok"), "--vocab-size", "300", "--character-coverage", "2"], ""

    @case("tokenizer-vocab-too-large", "tokenizer", "a --vocab-size larger than the text yields",
          "tokenizer train: --vocab-size 100000 is more pieces than 1 lines of text yield (at most *): lower it or "
          "train on more text")
    def _(b, d):
        return ["tokenizer", "train", "--input", write(d, "corpus.txt", "some text\n"), "--out",
                os.path.join(d, "tok"), "--vocab-size", "100000"], ""

    @case("tokenizer-vocab-below-characters", "tokenizer", "a --vocab-size below the pieces the text's characters need",
          "tokenizer train: --vocab-size 300 is too small for this text: the characters --character-coverage 0.99995 "
          "keeps need 860 pieces (with the byte and special pieces); raise --vocab-size to at least that or lower "
          "--character-coverage (down to 0.98)")
    def _(b, d):
        text = "".join(chr(0x4E00 + i) for i in range(600)) + "\n"  # 600 distinct characters, each needed
        return ["tokenizer", "train", "--input", write(d, "corpus.txt", text), "--out",
                os.path.join(d, "tok"), "--vocab-size", "300"], ""

    @case("tokenizer-encode-not-utf8", "tokenizer", "tokenizer encode --text with a byte that is not UTF-8",
          "--text: not UTF-8 text: invalid byte 0xff at byte offset 3")
    def _(b, d):
        tok = tokenizer_dir(d, {"type": "bytes", "vocab_size": 256})
        return ["tokenizer", "encode", "--tokenizer", tok, "--text", os.fsdecode(b"bad\xffbyte")], ""

    @case("tokenizer-out-holds-input", "tokenizer", "tokenizer train --force into the directory of its input",
          "D: --out must not be (or contain) the input D/corpus.txt")
    def _(b, d):
        corpus = write(d, "corpus.txt", "some text\n")
        return ["tokenizer", "train", "--input", corpus, "--out", d, "--vocab-size", "300", "--force"], ""

    @case("prepare-out-is-tokenizer", "data", "data prepare --force into its own tokenizer directory",
          "D/tok: --out must not be (or contain) the input D/tok")
    def _(b, d):
        corpus = write(d, "corpus.txt", "some text\n")
        tok = tokenizer_dir(d, None)
        return ["data", "prepare", "--tokenizer", tok, "--input", corpus, "--out", tok, "--force"], ""

    @case("prepare-force-over-other-files", "data", "data prepare --force into a directory that is no earlier output",
          "D/mine: holds files but no manifest.json: not an earlier output of this command, so --force does not "
          "replace it (remove it yourself, or choose another --out)")
    def _(b, d):
        corpus = write(d, "corpus.txt", "some text\n")
        os.makedirs(os.path.join(d, "mine"))
        write(os.path.join(d, "mine"), "notes.txt", "keep\n")
        tok = tokenizer_dir(d, {"type": "bytes", "vocab_size": 256})
        return ["data", "prepare", "--tokenizer", tok, "--input", corpus, "--out", os.path.join(d, "mine"),
                "--force"], ""

    @case("prepare-empty-delimiter", "data", "data prepare --doc-delimiter '' (it used to be ignored: one document)",
          "--doc-delimiter: empty (to split documents at empty lines: --doc-split blank-lines)")
    def _(b, d):
        corpus = write(d, "corpus.txt", "some text\n\nmore\n")
        tok = tokenizer_dir(d, {"type": "bytes", "vocab_size": 256})
        return ["data", "prepare", "--tokenizer", tok, "--input", corpus, "--out", os.path.join(d, "out"),
                "--doc-delimiter", ""], ""

    # ---- checkpoints ----
    @case("checkpoint-flipped-byte", "checkpoints", "a flipped bit in the weights (eval)",
          "D/run/checkpoints/step_00000002/model.safetensors: checksum mismatch (xxh3_64 *, the manifest says *): "
          "the file is corrupt")
    def _(b, d):
        ck = trained(b, d)
        flip(os.path.join(ck, "step_00000002", "model.safetensors"))
        return ["eval", "--checkpoint", os.path.join(ck, "step_00000002")], ""

    @case("checkpoint-truncated", "checkpoints", "a truncated weights file (eval; it does not read the optimizer's)",
          "D/run/checkpoints/step_00000002/model.safetensors: tensor 'lm_head.weight': data_offsets "
          "[*] extend past the end of the data region (* bytes)")
    def _(b, d):
        ck = trained(b, d)
        f = os.path.join(ck, "step_00000002", "model.safetensors")
        os.truncate(f, os.path.getsize(f) - 7)
        return ["eval", "--checkpoint", os.path.join(ck, "step_00000002")], ""

    @case("checkpoint-appended", "checkpoints", "bytes appended to the weights",
          "D/run/checkpoints/step_00000002/model.safetensors: data region has 4 trailing bytes after offset * that "
          "belong to no tensor")
    def _(b, d):
        ck = trained(b, d)
        with open(os.path.join(ck, "step_00000002", "model.safetensors"), "ab") as f:
            f.write(b"junk")
        return ["eval", "--checkpoint", os.path.join(ck, "step_00000002")], ""

    @case("checkpoint-state-edited", "checkpoints", "trainer_state.json changed but still valid JSON (resume)",
          "D/run/checkpoints: no checkpoint loads and verifies (2 tried); the newest: "
          "D/run/checkpoints/step_00000002/trainer_state.json: * bytes, the manifest says * (corrupt)")
    def _(b, d):
        ck = trained(b, d)
        for s in ("step_00000001", "step_00000002"):
            ts = os.path.join(ck, s, "trainer_state.json")
            j = json.load(open(ts))
            j["step"] = 1000
            json.dump(j, open(ts, "w"), indent=4)
        return ["train", "--config", config(d, tiny(steps=4)), "--run-dir", os.path.join(d, "run"), "--resume"], ""

    @case("checkpoint-all-corrupt", "checkpoints", "--resume when no checkpoint verifies",
          "D/run/checkpoints: no checkpoint loads and verifies (2 tried); the newest: "
          "D/run/checkpoints/step_00000002/model.safetensors: checksum mismatch (xxh3_64 *, the manifest says *): "
          "the file is corrupt")
    def _(b, d):
        ck = trained(b, d)
        for s in ("step_00000001", "step_00000002"):
            flip(os.path.join(ck, s, "model.safetensors"))
        return ["train", "--config", config(d, tiny(steps=4)), "--run-dir", os.path.join(d, "run"), "--resume"], ""

    @case("checkpoint-manifest-bad", "checkpoints", "manifest.json is not JSON",
          "D/run/checkpoints/step_00000002/manifest.json: invalid JSON: *")
    def _(b, d):
        ck = trained(b, d)
        write(os.path.join(ck, "step_00000002"), "manifest.json", "{")
        return ["eval", "--checkpoint", os.path.join(ck, "step_00000002")], ""

    @case("checkpoint-missing-file", "checkpoints", "a file the manifest lists is gone",
          "D/run/checkpoints/step_00000002/trainer_state.json: missing (listed in manifest.json)")
    def _(b, d):
        ck = trained(b, d)
        os.remove(os.path.join(ck, "step_00000002", "trainer_state.json"))
        return ["eval", "--checkpoint", os.path.join(ck, "step_00000002")], ""

    @case("checkpoint-latest-malformed", "checkpoints", "`latest` holds garbage (eval of the run)",
          "D/run/checkpoints/latest: malformed: expected a checkpoint directory name like step_00000100, got 'garbage'")
    def _(b, d):
        ck = trained(b, d)
        write(ck, "latest", "garbage\n")
        return ["eval", "--checkpoint", os.path.join(d, "run")], ""

    @case("checkpoint-bad-tensor-shape", "checkpoints", "a checkpoint whose tensors do not match its config",
          "D/ck/model.safetensors: missing tensor 'model.embed_tokens.weight' (and * more problems)")
    def _(b, d):
        ck = os.path.join(d, "ck")
        os.makedirs(ck)
        c = dict(HF_LLAMA)
        c["kv_shift"] = {"enabled": True}
        write(ck, "config.json", json.dumps(c))
        write(ck, "model.safetensors", safetensors_bytes({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                                                          b"\0\0\0\0"), "wb")
        return ["forward", "--checkpoint", ck, "--tokens", write(d, "t.txt", "1 2"), "--out",
                os.path.join(d, "l.npy")], ""

    # ---- Hugging Face import ----
    @case("hf-no-weights", "HF import", "a model directory without safetensors",
          "D/hf: no model.safetensors or model.safetensors.index.json (only safetensors checkpoints are supported)")
    def _(b, d):
        return ["import-hf", "--model", hf_dir(d, HF_LLAMA), "--out", os.path.join(d, "out")], ""

    @case("hf-no-config", "HF import", "a model directory without config.json",
          "D/hf/config.json: missing (not a Hugging Face model directory?)")
    def _(b, d):
        return ["import-hf", "--model", hf_dir(d, None, b""), "--out", os.path.join(d, "out")], ""

    @case("hf-bad-safetensors", "HF import", "weights that are not safetensors",
          "D/hf/model.safetensors: header length * exceeds the 0 bytes after the length field (truncated or not a "
          "safetensors file)")
    def _(b, d):
        return ["import-hf", "--model", hf_dir(d, HF_LLAMA, b"garbage!"), "--out", os.path.join(d, "out")], ""

    @case("hf-tiny-file", "HF import", "a weights file shorter than a safetensors header",
          "D/hf/model.safetensors: not a safetensors file: 1 bytes, expected at least 8 (the header length)")
    def _(b, d):
        return ["import-hf", "--model", hf_dir(d, HF_LLAMA, b"x"), "--out", os.path.join(d, "out")], ""

    @case("hf-bad-window", "HF import", "an unsupported --window",
          "--window: must be 1, 2 or 3 (the windows training supports), got 5")
    def _(b, d):
        return ["import-hf", "--model", hf_dir(d, HF_LLAMA, b"x"), "--out", os.path.join(d, "out"),
                "--kv-shift-init", "paper", "--window", "5"], ""

    @case("hf-window-without-init", "HF import", "--window without a shift to add (it would be ignored)",
          "--window: sets the window of added shift parameters: needs --kv-shift-init paper or identity")
    def _(b, d):
        return ["import-hf", "--model", hf_dir(d, HF_LLAMA, b"x"), "--out", os.path.join(d, "out"), "--window",
                "2"], ""

    @case("hf-nan-weight", "HF import", "a weight that is NaN",
          "D/hf/model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight' element 5 is nan (refusing to import a "
          "broken model)")
    def _(b, d):
        return ["import-hf", "--model", hf_dir(d, HF_LLAMA, llama_tensors("model.layers.0.mlp.up_proj.weight", 5)),
                "--out", os.path.join(d, "out")], ""

    @case("hf-int-out-of-range", "HF import", "a config integer beyond 32 bits (it would wrap to a small one)",
          "D/hf/config.json: num_hidden_layers: 4294967297 is out of range")
    def _(b, d):
        return ["import-hf", "--model", hf_dir(d, dict(HF_LLAMA, num_hidden_layers=2**32 + 1), llama_tensors()),
                "--out", os.path.join(d, "out")], ""

    @case("hf-negative-seed", "HF import", "a negative --seed (an unsigned seed would wrap around)",
          "import-hf: --seed: must be a non-negative integer, got '-5' (kvshift import-hf --help lists its options)")
    def _(b, d):
        return ["import-hf", "--model", hf_dir(d, HF_LLAMA, b"x"), "--out", os.path.join(d, "out"),
                "--kv-shift-init", "paper", "--seed", "-5"], ""

    @case("hf-export-force-over-run", "HF export", "export-hf --force into a training run's directory (it holds a "
          "config.json too)",
          "D/other: holds checkpoints: a training run or a checkpoint, not an earlier output of this command, so "
          "--force does not replace it (remove it yourself, or choose another --out)")
    def _(b, d):
        ckpts = trained(b, d)
        other = os.path.join(d, "other")
        os.makedirs(os.path.join(other, "checkpoints"))
        write(other, "config.json", "{}")
        write(other, "metrics.jsonl", "")
        return ["export-hf", "--checkpoint", ckpts, "--out", other, "--force"], ""

    # ---- launch environment ----
    @case("env-torchrun-cpu", "launch", "torchrun with several ranks on the CPU",
          "rank 0/2: torchrun started 2 ranks on device \"cpu\", but the CPU backend's collectives are MPI, which "
          "needs mpirun: launch CPU runs with `mpirun -np 2 kvshift ...` (docs/LAUNCH.md)")
    def _(b, d):
        return ["train", "--config", config(d, tiny()), "--run-dir", os.path.join(d, "run")], \
            "env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500"

    @case("env-bad-rank", "launch", "RANK outside WORLD_SIZE",
          "RANK=5 is outside 0..1 (WORLD_SIZE=2)")
    def _(b, d):
        return ["train", "--config", config(d, tiny()), "--run-dir", os.path.join(d, "run")], \
            "env RANK=5 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500"

    @case("env-bad-timeout", "launch", "a collective timeout that is not a number (mpirun)",
          "KVS_COLLECTIVE_TIMEOUT_S='soon' is not a positive number of seconds")
    def _(b, d):
        return ["dist-selftest"], f"env {MPI_ENV} KVS_COLLECTIVE_TIMEOUT_S=soon mpirun --oversubscribe -np 1"

    @case("env-bad-progress", "launch", "an MPI progress interval that is not a number (mpirun)",
          "KVS_MPI_PROGRESS_US='fast' is not a number of microseconds in [0, 1000000]")
    def _(b, d):
        return ["dist-selftest"], f"env {MPI_ENV} KVS_MPI_PROGRESS_US=fast mpirun --oversubscribe -np 1"

    @case("env-tp-not-dividing", "launch", "parallel.tp that does not divide the processes",
          "parallel.tp (2) must divide the number of processes (3): the world is dp x tp ranks")
    def _(b, d):
        c = tiny()
        c["parallel"] = {"tp": 2}
        return ["train", "--config", config(d, c), "--run-dir", os.path.join(d, "run")], \
            f"env {MPI_ENV} OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np 3"

    @case("env-bench-tp-one-process", "launch", "bench of a tp = 2 config in one process (it would time the unsplit model)",
          "parallel.tp (2) must divide the number of processes (1): the world is dp x tp ranks")
    def _(b, d):
        c = tiny()
        c["parallel"] = {"tp": 2}
        return ["bench", "--config", config(d, c), "--steps", "1"], ""

    @case("env-one-process-subcommand", "launch", "a one-process subcommand launched as several ranks",
          "info runs in one process, but torchrun started 2 ranks: run it without a launcher (train, bench and eval "
          "are the subcommands that run across processes)")
    def _(b, d):
        return ["info", "--config", config(d, tiny())], \
            "env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500"

    @case("env-cuda-without-gpu", "launch", "device cuda on a machine without a GPU",
          "device 'cuda': no usable GPU (*)")
    def _(b, d):
        c = tiny()
        c["device"] = "cuda"
        c["model"]["hidden_size"] = 32
        return ["train", "--config", config(d, c), "--run-dir", os.path.join(d, "run")], ""

    return C


# GoogleTests that check the same error at the library level (the catalogue
# checks what the user sees); docs/RELIABILITY.md links them.
LINKS = {
    "config-seed-past-2-53": "Config.WrongTypesNameKeyAndValue",
    "cli-forward-out-into-checkpoint": "Cli.ForwardAndBackwardNeverWriteOverTheirInputs",
    "cli-backward-inf-mask": "Cli.BackwardIgnoresTheTargetsOfUnscoredPositions",
    "cli-eval-run-config-bad": "Cli.CheckpointReadersWithoutLatestOrWithABrokenRunConfig",
    "config-missing": "Cli.MissingConfigIsOneLineError, Config.LoadConfigFileErrors",
    "env-bench-tp-one-process": "DistBench.LayoutTheWorldCannotHoldIsOneError",
    "env-one-process-subcommand": "LaunchWorld.OneProcessSubcommandsRefuseSeveralRanks",
    "config-not-json": "Config.LoadConfigFileErrors",
    "config-unknown-key": "Cli.UnknownKeyNamesTheKey, Config.UnknownKeySuggestions",
    "config-wrong-type": "Config.WrongTypesNameKeyAndValue",
    "config-bad-enum": "Config.EnumValuesAreCheckedWhenRead",
    "config-duplicate-key": "Config.LoadConfigFileErrors",
    "config-missing-model": "Config.RequiredModelKeys",
    "config-seq-too-long": "Config.ValidationRulesNameTheKey",
    "config-heads-divide": "Config.ValidationRulesNameTheKey",
    "config-stop-signal": "StopSignal.ConfigKeyNamesTheSignal",
    "cli-bad-override": "Cli.BadOverrideIsRejectedBeforeAnyWork, Config.BadOverridesError",
    "cli-override-unknown": "Config.BadOverridesError",
    "cli-resume-other-model": "Train.ResumeRejectsADifferentModel",
    "cli-resume-other-seq-len": "Train.ResumeRejectsADifferentModel",
    "cli-resume-past-steps": "Train.ResumeRejectsADifferentModel",
    "cli-run-dir-is-a-checkpoint": "Train.RefusesARunDirectoryHoldingAModel",
    "cli-run-dir-held": "Train.RefusesARunDirectoryAnotherTrainerHolds",
    "cli-overwrite-run": "Train.RefusesToOverwriteARun",
    "shard-data-changed": "Cli.ResumeRefusesDataThatChangedUnderIt",
    "shard-matched-twice": "DataShardDataset.AFileMatchedTwiceOrADirectoryIsAnError",
    "shard-glob-directory": "DataShardDataset.AFileMatchedTwiceOrADirectoryIsAnError",
    "tokenizer-no-bos-for-documents": "DataTokenizerCheck.DocumentBoundariesNeedTheTokenizersBos",
    "shard-blend-weights": "BlendedDataset.ConfigRules",
    "shard-blend-source-short": "BlendedDataset.ValidationFilesPerSource",
    "shard-bad-magic": "DataShards.CorruptFilesNameThePath",
    "shard-truncated": "DataShards.CorruptFilesNameThePath",
    "shard-manifest-missing": "DataShardDataset.ShardsAreCheckedAgainstTheirManifest",
    "shard-version": "DataShards.CorruptFilesNameThePath",
    "shard-token-bytes": "DataShards.CorruptFilesNameThePath",
    "shard-out-of-vocab": "Cli.OutOfVocabularyTokenInShardsNamesFileAndPosition",
    "shard-too-short": "DataShardDataset.Errors",
    "shard-missing": "DataShardDataset.Errors",
    "tokenizer-train-no-input": "TokenizerTrain.InputErrorsNameTheFileAndLeaveNoOutput",
    "tokenizer-out-holds-input": "DataPrepare.ForceNeverDeletesAnInput",
    "prepare-out-is-tokenizer": "DataPrepare.ForceNeverDeletesAnInput",
    "prepare-force-over-other-files": "DataPrepare.ForceReplacesOnlyAnEarlierOutputAndFollowsALink",
    "checkpoint-flipped-byte": "CheckpointManifest.CorruptionIsAOneLineErrorNamingTheFile",
    "checkpoint-truncated": "Checkpoint.MissingOrCorruptFilesNameTheFile",
    "checkpoint-missing-file": "CheckpointManifest.CorruptionIsAOneLineErrorNamingTheFile",
    "checkpoint-manifest-bad": "CheckpointManifest.CorruptionIsAOneLineErrorNamingTheFile",
    "checkpoint-all-corrupt": "ResumeFallback.NothingVerifiesIsAOneLineErrorWithTheNewestProblem",
    "checkpoint-latest-malformed": "Checkpoint.LatestErrors",
    "checkpoint-bad-tensor-shape": "Checkpoint.ValidateModelTensors",
    "hf-bad-window": "HfConfig.ImportDefaultsAndRefusals",
    "env-torchrun-cpu": "LaunchWorld.TorchrunCpuRunFailsOnEveryRankAtOnce",
    "env-bad-rank": "Launch.BadEnvironments",
    "env-tp-not-dividing": "TensorParallel.WorldNotAMultipleOfTpIsAClearError",
    "env-cuda-without-gpu": "Cli.CudaWithoutAGpuIsOneLineError",
}


def markdown():
    out = ["| case | area | bad input | the error line | also tested by |", "|---|---|---|---|---|"]
    for cid, area, what, _, line in cases():
        out.append(f"| `{cid}` | {area} | {what} | `kvshift: error: {line}` | {LINKS.get(cid, '')} |")
    return "\n".join(out)


def matches(pattern, line):
    """`*` in the catalogue stands for a value that differs between runs (a checksum, a size)."""
    rx = "^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "$"
    return re.match(rx, line) is not None


def doc_rows(path):
    rows = {}
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^\| `([a-z0-9-]+)` \|[^|]*\|[^|]*\| `kvshift: error: (.*)` \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvshift", required=True)
    ap.add_argument("--only", default=None)
    ap.add_argument("--print", action="store_true", help="print each case's actual error line")
    ap.add_argument("--markdown", action="store_true", help="print the catalogue table for docs/RELIABILITY.md")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "RELIABILITY.md"))
    a = ap.parse_args()
    if a.markdown:
        print(markdown())
        return 0
    binary = os.path.abspath(a.kvshift)
    rows = doc_rows(a.doc)
    passed = failed = 0
    for cid, area, what, setup, want in cases():
        if a.only and cid != a.only:
            continue
        d = tempfile.mkdtemp(prefix="kvs_bad_")
        problem = None
        try:
            args, prefix = setup(binary, d)
            cmd = (prefix + " " if prefix else "") + " ".join([binary] + [sh_quote(x) for x in args])
            try:
                r = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
                                   env=dict(os.environ, OMP_NUM_THREADS="1"))
                out = r.stdout.decode(errors="replace")
                errs = [l[len("kvshift: error: "):] for l in out.splitlines() if l.startswith("kvshift: error: ")]
                got = [e.replace(d, "D") for e in errs]
                if a.print:
                    print(f"{cid}: {got}")
                if r.returncode == 0:
                    problem = "exit 0"
                elif len(got) != 1:
                    problem = f"{len(got)} error lines: {out[-600:]}"
                elif "LOG(" in out:  # a library's own log line (sentencepiece's) leaked beside ours
                    problem = f"a library's log line: {out[-600:]}"
                elif not matches(want, got[0]):
                    problem = f"error line differs:\n      got  {got[0]}\n      want {want}"
            except subprocess.TimeoutExpired:
                problem = "hung (no exit within 120 s)"
            if problem is None and cid not in rows:
                problem = "not in docs/RELIABILITY.md's catalogue"
            elif problem is None and rows[cid] != want:
                problem = f"docs/RELIABILITY.md says `{rows[cid]}`"
        finally:
            shutil.rmtree(d, ignore_errors=True)
        if problem:
            failed += 1
            print(f"FAIL {cid} ({area}: {what}): {problem}")
        else:
            passed += 1
            print(f"ok   {cid}")
    extra = set(rows) - {c[0] for c in cases()}
    if extra and not a.only:
        failed += len(extra)
        print("FAIL docs/RELIABILITY.md lists cases that do not exist: " + ", ".join(sorted(extra)))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


if __name__ == "__main__":
    sys.exit(main())
