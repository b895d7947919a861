#!/usr/bin/python3
"""lm-evaluation-harness through an export (CTest `hf_lm_eval`; docs/EVAL.md).

    /usr/bin/python3 tests/hf/run_lm_eval.py --kvshift BUILD/kvshift --workdir BUILD/lm_eval_test

Runs under .venv-hf5/bin/python (scripts/setup.sh: lm_eval, transformers 5.x, torch 2.x). It trains
a sentencepiece tokenizer, writes a random-weight KV shifting checkpoint (GQA, Llama 3 RoPE), exports
it with `kvshift export-hf --dtype fp32 --tokenizer`, writes a multiple-choice task in the harness's
own format (a YAML task over a local JSONL file) and runs lm_eval's Python API on it with the `hf`
model and trust_remote_code. The check: every (question, choice) log-likelihood lm_eval reports
equals the one computed directly from `kvshift forward` logits on the same token ids (1e-4), and
lm_eval's accuracy equals the accuracy those give. Everything is local: HF_HUB_OFFLINE=1,
HF_DATASETS_OFFLINE=1, no network.

Without .venv-hf5 (or without lm_eval in it) it prints what it skipped and `0 passed, 0 failed`.
Prints one line per check and `N passed, N failed`; exits 1 on any failure.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.join(REPO, ".venv-hf5")
VENV_PY = os.path.join(VENV, "bin", "python")
if os.path.exists(VENV_PY) and os.path.realpath(sys.prefix) != os.path.realpath(VENV):
    os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__)] + sys.argv[1:])

os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                  HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false")

QUESTIONS = [  # context, choices, label: the label is arbitrary (the model is random); the check is equality
    ("the cat sat on the", ["mat", "dog", "sun"], 0),
    ("the dog ran after the", ["cat", "mat", "number"], 0),
    ("number seven is after number", ["six", "the", "mat"], 0),
    ("the sun is", ["hot", "cold", "a cat"], 0),
    ("on the mat sat the", ["cat", "dog"], 1),
    ("the cat and the dog", ["ran", "sat", "are friends"], 2),
    ("after it ran the", ["dog", "cat", "sun"], 1),
    ("it sat on the mat and the", ["dog ran", "cat sat", "sun set"], 0),
]

TASK_YAML = """task: kvs_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


class Tally:
    def __init__(self):
        self.passed, self.failed = 0, 0

    def record(self, name, ok, detail=""):
        print(f"{name:<60} {detail:<36} {'PASS' if ok else 'FAIL'}", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return r


def make_export(binary, work):
    """A tokenizer, a random shifted checkpoint of its vocabulary, and the fp32 export with it."""
    import sentencepiece as spm
    sys.path.insert(0, os.path.join(REPO, "tests", "oracle"))
    from run_oracle import draw_weights, make_config, write_checkpoint
    tok = os.path.join(work, "tok")
    os.makedirs(tok)
    text = os.path.join(work, "text.txt")
    with open(text, "w") as f:
        for i in range(300):
            f.write(f"the cat {i} sat on the mat and the dog ran after it number {i * 7} the sun is hot\n")
    spm.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(tok, "tokenizer"), vocab_size=60,
                                   model_type="bpe", minloglevel=2, hard_vocab_limit=False)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(tok, "tokenizer.model"))
    json.dump({"vocab_size": sp.get_piece_size(), "bos_id": sp.bos_id(), "eos_id": sp.eos_id(),
               "unk_id": sp.unk_id(), "pad_id": sp.pad_id(), "sha256": ""},
              open(os.path.join(tok, "kvshift_tokenizer.json"), "w"))
    cfg = make_config(32, 4, 2, 48, 2, sp.get_piece_size(), False, True, theta=500000.0)
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 32}
    ckpt = os.path.join(work, "ckpt")
    write_checkpoint(ckpt, cfg, draw_weights(cfg, 301))
    out = os.path.join(work, "hf")
    run([binary, "export-hf", "--checkpoint", ckpt, "--out", out, "--dtype", "fp32", "--tokenizer", tok])
    return ckpt, out


def loglikelihood(binary, ckpt, ids, n_cont, work):
    """Sum of log p(continuation) for token ids whose last n_cont tokens are the continuation."""
    import numpy as np
    path = os.path.join(work, "ids.txt")
    with open(path, "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    out = os.path.join(work, "logits.npy")
    run([binary, "forward", "--checkpoint", ckpt, "--tokens", path, "--out", out])
    logits = np.load(out).astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    T = len(ids)
    return float(sum(logp[t - 1, ids[t]] for t in range(T - n_cont, T)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvshift", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    try:
        import lm_eval
        import transformers
        import torch
    except ImportError as e:
        print(f"skipped: the lm-evaluation-harness check needs .venv-hf5 with lm_eval (scripts/setup.sh); "
              f"{sys.executable} cannot import {e.name}")
        print("0 passed, 0 failed, 1 skipped")
        return 77  # ctest's SKIP_RETURN_CODE: shown as not run, not as passed
    from lm_eval.tasks import TaskManager
    torch.set_num_threads(2)
    transformers.logging.set_verbosity_error()
    print(f"mode: lm_eval {lm_eval.__version__ if hasattr(lm_eval, '__version__') else '?'}, transformers "
          f"{transformers.__version__}, torch {torch.__version__} ({sys.executable})", flush=True)
    work = os.path.abspath(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    t = Tally()
    try:
        ckpt, hf_dir = make_export(a.kvshift, work)
        task_dir = os.path.join(work, "tasks")
        os.makedirs(task_dir)
        data = os.path.join(task_dir, "kvs_mc.jsonl")
        with open(data, "w") as f:
            for c, ch, lab in QUESTIONS:
                f.write(json.dumps({"context": c, "choices": ch, "label": lab}) + "\n")
        with open(os.path.join(task_dir, "kvs_mc.yaml"), "w") as f:
            f.write(TASK_YAML.format(data=data))
        os.environ["HF_DATASETS_CACHE"] = os.path.join(work, "datasets_cache")
        results = lm_eval.simple_evaluate(
            model="hf", model_args=f"pretrained={hf_dir},trust_remote_code=True,dtype=float32,add_bos_token=True",
            tasks=["kvs_mc"], task_manager=TaskManager(include_path=task_dir), batch_size=4, device="cpu",
            log_samples=True)
        samples = sorted(results["samples"]["kvs_mc"], key=lambda s: s["doc_id"])
        acc = results["results"]["kvs_mc"]["acc,none"]
        t.record("lm_eval ran the YAML task over the local JSONL", len(samples) == len(QUESTIONS),
                 f"{len(samples)} docs, acc {acc:.3f}")

        # Direct: the same context / continuation split lm_eval's hf model makes (BOS, then the text;
        # the continuation is what encoding the whole adds to encoding the context), our forward's logits.
        tok = transformers.AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
        bos = [tok.bos_token_id]
        worst, correct = 0.0, 0
        for s, (context, choices, label) in zip(samples, QUESTIONS):
            ours = []
            for i, choice in enumerate(choices):
                whole = bos + tok(context + " " + choice, add_special_tokens=False)["input_ids"]
                ctx = bos + tok(context, add_special_tokens=False)["input_ids"]
                ll = loglikelihood(a.kvshift, ckpt, whole, len(whole) - len(ctx), work)
                ours.append(ll)
                theirs = float(s["resps"][i][0][0])
                worst = max(worst, abs(ll - theirs) / max(1.0, abs(ll)))
            correct += int(max(range(len(ours)), key=lambda i: ours[i]) == label)
        t.record("every log-likelihood == kvshift forward's (1e-4)", worst < 1e-4, f"worst rel {worst:.1e}")
        t.record("lm_eval accuracy == direct accuracy", abs(acc - correct / len(QUESTIONS)) < 1e-12,
                 f"{acc:.3f} vs {correct}/{len(QUESTIONS)}")

        # The `lm_eval` command as docs/EVAL.md gives it (it prints a results table: pytablewriter).
        cli = os.path.join(os.path.dirname(sys.executable), "lm_eval")
        p = subprocess.run([cli, "--model", "hf", "--model_args",
                            f"pretrained={hf_dir},trust_remote_code=True,dtype=float32,add_bos_token=True",
                            "--include_path", task_dir, "--tasks", "kvs_mc", "--batch_size", "8", "--device", "cpu"],
                           capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1",
                                                                   HF_DATASETS_OFFLINE="1"))
        row = next((l for l in p.stdout.splitlines() if "kvs_mc" in l and "acc" in l), "")
        cells = [c.strip() for c in row.split("|")]
        value = cells[cells.index("acc") + 2] if "acc" in cells and cells.index("acc") + 2 < len(cells) else ""
        t.record("the lm_eval command (docs/EVAL.md) prints the task's accuracy",
                 p.returncode == 0 and value.replace(".", "", 1).isdigit() and abs(float(value) - acc) < 1e-3,
                 row.strip()[:60] if p.returncode == 0 else (p.stderr.strip().splitlines() or ["rc %d" % p.returncode])[-1][:60])
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        t.record("driver ran to the end", False, type(e).__name__)
    print(f"{t.passed} passed, {t.failed} failed")
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
