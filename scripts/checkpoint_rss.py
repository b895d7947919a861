#!/usr/bin/env python3
"""Host memory of a checkpoint save and of a resume, per rank (docs/PARALLEL.md "Checkpoints").

Runs `kvshift train` under mpirun on lm-small widened to 56M parameters (hidden 512, 8 layers,
vocabulary 32000, generated n-gram data; a 641 MB checkpoint), samples every rank's resident
memory (VmRSS) every 10 ms, and prints per rank: its RSS when the save started (the first
checkpoints/.tmp-* directory), the peak while it was written, and the peak of the whole run.
With --resume the run directory is kept and the run resumes from it.

  python3 scripts/checkpoint_rss.py --np 2 --run-dir /tmp/rss_dp2                 # fresh, one save
  python3 scripts/checkpoint_rss.py --np 2 --run-dir /tmp/rss_dp2 --resume --steps 4
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvshift", default=os.path.join(ROOT, "build", "kvshift"), help="the binary (default build/kvshift)")
    ap.add_argument("--np", type=int, default=2, help="MPI ranks (default 2: dp 2, ZeRO-1)")
    ap.add_argument("--run-dir", required=True, help="the run directory (removed first unless --resume)")
    ap.add_argument("--resume", action="store_true", help="resume from the run directory's checkpoint")
    ap.add_argument("--steps", type=int, default=3, help="train.steps (a save at the last; default 3)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more config overrides")
    a = ap.parse_args()
    kvs = os.path.abspath(a.kvshift)
    if not a.resume:
        shutil.rmtree(a.run_dir, ignore_errors=True)
    sets = ["model.hidden_size=512", "model.intermediate_size=1376", "model.num_hidden_layers=8",
            "model.num_attention_heads=8", "model.num_key_value_heads=4", "model.vocab_size=32000",
            "model.max_position_embeddings=64", "train.seq_len=64", "train.micro_batch_size=1",
            f"train.grad_accum_steps={a.np}", f"train.steps={a.steps}", "train.eval_every=0", "train.threads=1",
            'data={"type":"ngram","ngram":{"token_lo":11,"token_hi":128,"num_pairs":200,"table_seed":0}}'] + a.set
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(a.np), kvs, "train", "--quiet",
           "--config", os.path.join(ROOT, "configs/toy/lm-small-kvshift.json"), "--run-dir", a.run_dir]
    for s in sets:
        cmd += ["--set", s]
    if a.resume:
        cmd.append("--resume")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    at_save, saving, saved, peak, save_peak = {}, False, False, {}, {}
    while p.poll() is None:
        pids = subprocess.run(["pgrep", "-f", "^" + kvs + " train"], capture_output=True, text=True).stdout.split()
        writing = bool(glob.glob(os.path.join(a.run_dir, "checkpoints", ".tmp-*")))
        if writing and not saving:
            saving = True
            at_save = {q: rss_mb(q) for q in pids}
        saved = saved or (saving and not writing)
        for q in pids:
            r = rss_mb(q)
            if r:
                peak[q] = max(peak.get(q, 0), r)
                if saving and not saved:
                    save_peak[q] = max(save_peak.get(q, 0), r)
        time.sleep(0.01)
    out = p.stdout.read()
    if p.returncode:
        sys.exit(out + f"\ncheckpoint_rss: the run failed (exit {p.returncode})")
    for i, q in enumerate(sorted(peak, key=int)):
        print(f"process {i} (pid {q}): RSS when the save started {at_save.get(q, '-')} MB, "
              f"peak while saving {save_peak.get(q, '-')} MB, peak of the run {peak[q]} MB")


if __name__ == "__main__":
    main()
