#!/usr/bin/python3
"""End to end, the way a user goes from a folder of text files to a model that
Hugging Face transformers loads and generates from:

    kvshift tokenizer train -> kvshift data prepare -> kvshift train
    -> kvshift generate -> kvshift export-hf -> transformers: from_pretrained + generate

on a small corpus written by the test (Python's own help topics, pydoc_data:
present wherever Python is). Checks: every command succeeds; the tokenizer
round-trips the corpus; generation is deterministic and greedy ids equal
transformers' greedy generate() on the export (the cache path of both sides),
for a KV shifting model. Runs under .venv-hf/bin/python when it exists (the
transformers pinned by scripts/setup.sh), else the transformers steps are
reported as skipped.

    /usr/bin/python3 tests/pipeline/run_text_pipeline.py --kvshift BUILD/kvshift --workdir BUILD/pipeline
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_PY = os.path.join(REPO, ".venv-hf", "bin", "python")
if os.path.exists(VENV_PY) and os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(REPO, ".venv-hf")) \
        and not os.environ.get("KVS_PIPELINE_NO_VENV"):
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

passed, failed = 0, 0


def check(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print("PASS  " + what)
    else:
        failed += 1
        print("FAIL  %s%s" % (what, (": " + detail) if detail else ""))
    return cond


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print("$ " + " ".join(cmd) + "\n" + p.stdout[-2000:] + p.stderr[-2000:])
    return p


def write_corpus(folder):
    """About 20 text files of English prose: the topics `help()` prints."""
    import pydoc_data.topics as t
    os.makedirs(folder)
    names = sorted(t.topics)[:24]
    for i, name in enumerate(names):
        with open(os.path.join(folder, "%02d-%s.txt" % (i, name)), "w", encoding="utf-8") as f:
            f.write(t.topics[name])
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvshift", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    kv = os.path.abspath(a.kvshift)
    work = os.path.abspath(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    files = write_corpus(os.path.join(work, "texts"))

    tok = os.path.join(work, "tokenizer")
    p = run([kv, "tokenizer", "train", "--input"] + files + ["--vocab-size", "512", "--out", tok])
    if not check(p.returncode == 0 and os.path.isfile(os.path.join(tok, "tokenizer.model")),
                 "tokenizer train on %d text files" % len(files)):
        return 1
    sample = open(files[0], encoding="utf-8").read()[:300]
    p = run([kv, "tokenizer", "encode", "--tokenizer", tok, "--text", sample, "--json"])
    ids = json.loads(p.stdout).get("ids", []) if p.returncode == 0 else []
    # (the decode round trip itself is tests/tokenizer/test_tokenizer.cpp's; here: ids in range, fewer than bytes)
    check(0 < len(ids) < len(sample.encode()) and all(0 <= i < 512 for i in ids),
          "tokenizer encode: %d ids for %d bytes" % (len(ids), len(sample.encode())), p.stdout[-300:])

    data = os.path.join(work, "data")
    p = run([kv, "data", "prepare", "--tokenizer", tok, "--input"] + files + ["--out", data, "--val-fraction", "0.1"])
    if not check(p.returncode == 0 and os.path.isfile(os.path.join(data, "manifest.json")), "data prepare"):
        return 1

    cfg = {
        "name": "pipeline",
        "model": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 128,
                  "kv_shift": {"enabled": True}},
        "train": {"seq_len": 64, "micro_batch_size": 4, "steps": 30, "lr": 3e-3, "warmup_steps": 5,
                  "eval_every": 30, "eval_sequences": 8, "checkpoint_every": 30, "threads": 2},
        "data": {"type": "shards", "tokenizer": "tokenizer",
                 "shards": {"train": ["data/train_*.bin"], "val": ["data/val_*.bin"]}},
    }
    cfg_path = os.path.join(work, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    run_dir = os.path.join(work, "run")
    p = run([kv, "train", "--quiet", "--config", cfg_path, "--run-dir", run_dir])
    if not check(p.returncode == 0, "train 30 steps on the prepared shards", p.stdout[-500:]):
        return 1

    def generate(*extra):  # greedy unless extra sets a temperature (kvshift's default is 1: sampling)
        temp = [] if "--temperature" in extra else ["--temperature", "0"]
        p = run([kv, "generate", "--checkpoint", run_dir, "--prompt", "The", "--max-new-tokens", "12", "--json"]
                + temp + list(extra))
        return json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None

    g1, g2 = generate(), generate()
    check(g1 is not None and g1 == {**g2, "tokens_per_second": g1["tokens_per_second"],
                                    "prefill_seconds": g1["prefill_seconds"]},
          "kvshift generate (greedy, tokenizer from the run config) is deterministic", str(g1))
    s1, s2 = generate("--temperature", "0.8", "--top-p", "0.9", "--seed", "5"), \
        generate("--temperature", "0.8", "--top-p", "0.9", "--seed", "5")
    check(s1 is not None and s2 is not None and s1["ids"] == s2["ids"], "sampling with a seed is deterministic")

    out = os.path.join(work, "hf")
    p = run([kv, "export-hf", "--checkpoint", run_dir, "--out", out, "--dtype", "fp32"])
    if not check(p.returncode == 0 and os.path.isfile(os.path.join(out, "tokenizer.model")),
                 "export-hf with the tokenizer files"):
        return 1
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        print("SKIP  transformers steps: %s (run scripts/setup.sh for .venv-hf)" % e)
        print("%d passed, %d failed" % (passed, failed))
        return 1 if failed else 0
    if g1 is None:
        print("%d passed, %d failed" % (passed, failed))
        return 1
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, torch_dtype=torch.float32).eval()
    tk = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    ids = tk("The", return_tensors="pt").input_ids
    check(ids[0].tolist() == g1["prompt_ids"], "transformers' tokenizer gives kvshift's prompt ids",
          "%s vs %s" % (ids[0].tolist(), g1["prompt_ids"]))
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    hf_new = gen[0, ids.shape[1]:].tolist()
    want = g1["ids"]
    if g1.get("stop") == "eos":  # kvshift stopped at EOS; compare up to it
        hf_new = hf_new[:len(want)]
    check(hf_new == want, "transformers generate() (greedy, with its cache) == kvshift generate",
          "%s vs %s" % (hf_new, want))
    print("transformers text: %r" % tk.decode(gen[0], skip_special_tokens=True))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
