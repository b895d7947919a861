#!/usr/bin/env python3
"""Fault-injection harness for kvshift training (docs/RELIABILITY.md).

Each trial starts a small training run (one process, or `mpirun -np 2` with
data parallelism), hurts it, resumes it until it finishes, and compares its
loss curve with an uninterrupted run of the same layout, bit for bit:

  kill           SIGKILL of the whole job at a random moment
  kill-in-save   SIGKILL while a checkpoint is being written
  rank-kill      SIGKILL of one rank only (mpirun), mid-collective
  rank-hang      SIGSTOP of one rank: the others must stop within KVS_COLLECTIVE_TIMEOUT_S
  sigterm        SIGTERM (or SIGUSR1 to mpirun): checkpoint, exit 75, resume
  sigterm-twice  two SIGTERMs during a save: exit at once, `latest` untouched
  disk-full      a file-size limit (ulimit -f) while saving: one-line error, `latest` untouched
  flip-byte      one bit of the newest checkpoint's model file flipped: resume falls back to the previous one
  truncate       the newest checkpoint's optimizer file truncated: the same
  no-latest      checkpoints/latest deleted: resume finds the newest step directory

It prints one table: trials, resumed bit-identically, data lost (a checkpoint
that `latest` named before the fault could not be resumed from, or a curve that
differs from the uninterrupted run's), hangs (a run that outlived its time
limit). The exit status is 1 unless every trial resumed bit-identically with
nothing lost and nothing hung.

  python3 scripts/fault_harness.py --kvshift build/kvshift            # the full run
  python3 scripts/fault_harness.py --kvshift build/kvshift --short    # CI's short form
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMP_NUM_THREADS": "1"}
STEPS = 24
EVERY = 4
RUN_TIMEOUT_S = 90


def config(async_checkpoint):
    return {
        "name": "fault",
        "model": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 32, "max_position_embeddings": 16,
                  "kv_shift": {"enabled": True}},
        "data": {"type": "induction", "induction": {"token_lo": 2, "token_hi": 32, "pool_size": 8}},
        "train": {"seq_len": 16, "micro_batch_size": 2, "grad_accum_steps": 2, "steps": STEPS, "lr": 1e-2,
                  "warmup_steps": 2, "eval_every": 0, "eval_sequences": 8, "checkpoint_every": EVERY,
                  "keep_checkpoints": 3, "async_checkpoint": async_checkpoint, "threads": 1},
    }


class Harness:
    def __init__(self, kvshift, work, rng):
        self.kvshift = os.path.abspath(kvshift)
        self.work = work
        self.rng = rng
        self.mpirun = shutil.which("mpirun")
        self.refs = {}
        self.ref_time = {}
        self.train_time = {}
        self.n = 0

    # ---- processes ----
    def command(self, dp, cfg, run_dir, extra=()):
        cmd = [self.kvshift, "train", "--quiet", "--config", cfg, "--run-dir", run_dir, *extra]
        if dp > 1:
            cmd = [self.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(dp)] + cmd
        return cmd

    def env(self, extra=None):
        e = dict(os.environ)
        e.update(MPI_ENV)
        e.update(extra or {})
        return e

    def start(self, cmd, env, limit_kb=None):
        pre = None
        if limit_kb is not None:
            import resource

            def pre():
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit_kb * 1024, limit_kb * 1024))
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=pre)

    def finish(self, p, timeout=RUN_TIMEOUT_S):
        """(exit code, output, hung)"""
        try:
            out, _ = p.communicate(timeout=timeout)
            return p.returncode, out.decode(errors="replace"), False
        except subprocess.TimeoutExpired:
            self.kill_job(p)
            out, _ = p.communicate()
            return p.returncode, out.decode(errors="replace"), True
        finally:
            self.kill_job(p)  # nothing of this run may outlive it (and hold the run directory's lock)

    @staticmethod
    def processes():
        """(pid, fields of /proc/pid/stat after the name: state, ppid, pgrp, session, ..., argv[0]) of each process."""
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    argv0 = f.read().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            yield int(d), fields, argv0

    def session_pids(self, sid):
        """The live (not zombie) processes of session `sid`."""
        return [pid for pid, fields, _ in self.processes() if int(fields[3]) == sid and fields[0] != "Z"]

    def kill_job(self, p):
        """SIGKILL of the whole job, and wait until it is gone. mpirun puts each rank in its own process group,
        so a killpg of mpirun's group leaves the ranks alive until they notice; they share its session
        (start() makes a new one), so kill that."""
        deadline = time.time() + 10
        while True:
            pids = self.session_pids(p.pid)
            if not pids or time.time() > deadline:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def rank_pids(self, p):
        """The kvshift processes under mpirun `p` (its descendants)."""
        children = {}
        for pid, fields, argv0 in self.processes():
            children.setdefault(int(fields[1]), []).append((pid, argv0))
        found, todo = [], [p.pid]
        while todo:
            for pid, argv0 in children.get(todo.pop(), []):
                todo.append(pid)
                if os.path.basename(argv0) == "kvshift":
                    found.append(pid)
        return sorted(found)

    # ---- run directories ----
    @staticmethod
    def curve(run_dir):
        """step -> loss of every train line; None if a step appears twice."""
        c = {}
        path = os.path.join(run_dir, "metrics.jsonl")
        if not os.path.exists(path):
            return {}
        for line in open(path):
            j = json.loads(line)
            if j.get("type") == "train":
                if j["step"] in c:
                    return None
                c[j["step"]] = j["loss"]
        return c

    @staticmethod
    def steps_logged(run_dir):
        """Train lines in metrics.jsonl so far (a line being written is not counted)."""
        n = 0
        try:
            for line in open(os.path.join(run_dir, "metrics.jsonl")):
                try:
                    n += json.loads(line).get("type") == "train"
                except ValueError:
                    pass
        except OSError:
            pass
        return n

    @staticmethod
    def latest_step(run_dir):
        p = os.path.join(run_dir, "checkpoints", "latest")
        try:
            return int(open(p).read().strip()[5:])
        except (OSError, ValueError):
            return 0

    def resume_until_done(self, dp, cfg, run_dir, env=None):
        """Resumes (or starts, with no checkpoint) until the run finishes; (output, hung, resumed step)."""
        outs, first_step = [], None
        for _ in range(3):
            ck = os.path.join(run_dir, "checkpoints")
            has = os.path.isdir(ck) and any(e == "latest" or e.startswith("step_") for e in os.listdir(ck))
            rc, out, hung = self.finish(self.start(self.command(dp, cfg, run_dir, ["--resume"] if has else []),
                                                   self.env(env)))
            outs.append(out)
            if first_step is None:
                first_step = 0
                for line in out.splitlines():
                    if "resuming from" in line and "(step " in line:
                        first_step = int(line.rsplit("(step ", 1)[1].split(")")[0])
            if hung or rc == 0:
                return "".join(outs), hung, first_step, rc
        return "".join(outs), False, first_step, rc

    def fresh(self, name):
        self.n += 1
        d = os.path.join(self.work, f"{self.n:03d}-{name}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        return d

    def cfg_file(self, d, async_checkpoint, steps=STEPS):
        c = config(async_checkpoint)
        c["train"]["steps"] = steps
        path = os.path.join(d, "config.json")
        json.dump(c, open(path, "w"))
        return path

    def reference(self, dp):
        if dp not in self.refs:
            d = self.fresh(f"reference-dp{dp}")
            cfg = self.cfg_file(d, False)
            t = time.time()
            rc, out, hung = self.finish(self.start(self.command(dp, cfg, os.path.join(d, "run")), self.env()))
            self.ref_time[dp] = time.time() - t
            c = self.curve(os.path.join(d, "run"))
            if rc != 0 or hung or not c or len(c) != STEPS:
                sys.exit(f"fault_harness: the uninterrupted dp={dp} run failed (exit {rc}):\n{out}")
            self.refs[dp] = c
            # The steps alone (without start-up), for faults that must land while training runs.
            self.train_time[dp] = sum(json.loads(l).get("step_time_s", 0)
                                      for l in open(os.path.join(d, "run", "metrics.jsonl")))
        return self.refs[dp]

    # ---- trials: each returns (identical, lost, hung, note) ----
    def judge(self, dp, run_dir, latest_before, resumed_step, hung, out, rc):
        c = self.curve(run_dir)
        identical = c == self.reference(dp) and rc == 0
        lost = (not identical and not hung) or (resumed_step is not None and resumed_step < latest_before)
        note = "" if identical else f"exit {rc}; " + (out.strip().splitlines() or [""])[-1][:160]
        if identical and lost:
            first = (out.strip().splitlines() or [""])
            note = (f"the first resume started from step {resumed_step}, but `latest` named step {latest_before}: "
                    + " | ".join(l for l in first if "error" in l or "resuming" in l)[:240])
        return identical, lost, hung, note

    def trial_kill(self, dp, in_save, shrink=1.0, tries=3):
        d = self.fresh(("kill-in-save" if in_save else "kill") + f"-dp{dp}")
        cfg = self.cfg_file(d, self.rng.random() < 0.5)
        run = os.path.join(d, "run")
        env = {"KVS_FAULT_SAVE_PAUSE_S": "0.2"} if in_save else {}
        p = self.start(self.command(dp, cfg, run), self.env(env))
        hung = False
        if in_save:
            # Kill at a random moment inside the n-th save (its temp directory exists, the manifest not yet).
            want = self.rng.randint(1, STEPS // EVERY - 1)
            seen, deadline, tmp_seen = 0, time.time() + RUN_TIMEOUT_S, None
            while p.poll() is None and time.time() < deadline:
                ck = os.path.join(run, "checkpoints")
                tmps = [e for e in os.listdir(ck) if e.startswith(".tmp-step_")] if os.path.isdir(ck) else []
                if tmps and tmps[0] != tmp_seen:
                    tmp_seen = tmps[0]
                    seen += 1
                    if seen == want:
                        time.sleep(self.rng.uniform(0, 0.15))
                        break
                time.sleep(0.002)
        else:
            time.sleep(self.rng.uniform(0.05, 0.95) * self.ref_time[dp] * shrink)
        alive = p.poll() is None
        self.kill_job(p)
        p.communicate()
        if in_save and not (alive and seen == want):
            # The kill must land inside the save it aimed at, or the trial proves nothing.
            return False, False, False, f"the kill missed save {want} (saw {seen} saves; run alive: {alive})"
        if not in_save and not alive:
            # The run ended before the kill (faster than the reference): nothing was killed. Again, sooner.
            if tries > 1:
                return self.trial_kill(dp, in_save, shrink * 0.5, tries - 1)
            return False, False, False, "the kill came after the run had ended, three times"
        latest_before = self.latest_step(run)
        out, hung, resumed, rc = self.resume_until_done(dp, cfg, run)
        return self.judge(dp, run, latest_before, resumed, hung, out, rc)

    def trial_rank(self, hang):
        d = self.fresh("rank-hang" if hang else "rank-kill")
        cfg = self.cfg_file(d, False)
        run = os.path.join(d, "run")
        timeout_s = 3
        p = self.start(self.command(2, cfg, run), self.env({"KVS_COLLECTIVE_TIMEOUT_S": str(timeout_s)}))
        # Once training runs (start-up is MPI_Init, outside kvshift's deadlines), at a random step.
        self.wait_for_training(p, run)
        time.sleep(self.rng.uniform(0, 0.8) * self.train_time[2])
        pids = self.rank_pids(p)
        if not pids:
            self.finish(p)
            return False, False, False, "no rank process to stop or kill (the job had ended)"
        victim = self.rng.choice(pids)
        os.kill(victim, signal.SIGSTOP if hang else signal.SIGKILL)
        # The job must end by itself: within the collective timeout plus the diagnosis' grace and mpirun's teardown.
        rc, out, hung = self.finish(p, timeout=timeout_s + 30)
        if hang:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        named = not hang or "did not answer" in out or rc == 0
        latest_before = self.latest_step(run)
        if hung:
            last = (out.strip().splitlines() or ["(no output)"])[-1][:120]
            return False, False, True, f"the job did not stop by itself (latest checkpoint step {latest_before}): {last}"
        out2, hung2, resumed, rc2 = self.resume_until_done(2, cfg, run)
        ok = self.judge(2, run, latest_before, resumed, hung2, out2, rc2)
        note = ok[3] if named else "no line naming the hung rank: " + out.strip().splitlines()[-1][:120]
        return ok[0] and named, ok[1], ok[2], note

    @staticmethod
    def wait_for_training(p, run):
        m = os.path.join(run, "metrics.jsonl")
        while p.poll() is None and not (os.path.exists(m) and os.path.getsize(m) > 0):
            time.sleep(0.002)

    def trial_sigterm(self, dp, twice):
        d = self.fresh(("sigterm-twice" if twice else "sigterm") + f"-dp{dp}")
        cfg = self.cfg_file(d, self.rng.random() < 0.5)
        run = os.path.join(d, "run")
        env = {"KVS_FAULT_SAVE_PAUSE_S": "1.5"} if twice else {}
        p = self.start(self.command(dp, cfg, run), self.env(env))
        # mpirun forwards SIGUSR1 to the ranks (SIGTERM to mpirun tears the job down: docs/RELIABILITY.md).
        sig = signal.SIGTERM if dp == 1 else signal.SIGUSR1
        if twice:
            # During a save after the first one, so that there is a `latest` to leave untouched.
            ck = os.path.join(run, "checkpoints")
            while p.poll() is None and not (os.path.exists(os.path.join(ck, "latest")) and any(
                    e.startswith(".tmp-") for e in os.listdir(ck))):
                time.sleep(0.002)
            latest_at_signal = self.latest_step(run)
            if p.poll() is not None:
                return False, False, False, "the run ended before a save was in flight to signal"
            p.send_signal(signal.SIGTERM)
            time.sleep(0.4)  # past the 250 ms in which a repeat is the same request (`timeout`'s two)
            p.send_signal(signal.SIGTERM)
        else:
            self.wait_for_training(p, run)
            time.sleep(self.rng.uniform(0, 0.8) * self.train_time[dp])
            logged_at_signal = self.steps_logged(run)
            p.send_signal(sig)
        rc, out, hung = self.finish(p)
        if not twice and rc == 0 and logged_at_signal < STEPS - 1:
            # A normal end is fine only for a signal that came with the last step; earlier, it was ignored.
            return False, False, False, f"exit 0 after a signal at step {logged_at_signal} of {STEPS}"
        if hung:
            return False, False, True, "did not stop after the signal"
        expected = 128 + signal.SIGTERM if twice else 75
        note = ""
        if rc not in (expected, 0):
            note = f"exit {rc}, expected {expected}: " + (out.strip().splitlines() or [""])[-1][:120]
        if not twice and rc == 75 and "kvshift: stopped by" not in out:
            note = "no 'stopped by' line"
        if twice and rc == expected and self.latest_step(run) != latest_at_signal:
            note = "the second SIGTERM changed `latest`"
        latest_before = self.latest_step(run)
        out2, hung2, resumed, rc2 = self.resume_until_done(dp, cfg, run)
        identical, lost, hung2, n2 = self.judge(dp, run, latest_before, resumed, hung2, out2, rc2)
        return identical and not note, lost, hung2, note or n2

    def trial_damage(self, kind):
        """Runs 12 of the 24 steps (checkpoints at 4, 8, 12), damages the newest, resumes to the end."""
        d = self.fresh(kind)
        cfg_half = self.cfg_file(d, False, steps=12)
        cfg = os.path.join(d, "config_full.json")
        json.dump(config(False), open(cfg, "w"))
        run = os.path.join(d, "run")
        rc, out, hung = self.finish(self.start(self.command(1, cfg_half, run), self.env()))
        if rc != 0 or hung:
            return False, True, hung, "setup run failed: " + out[-200:]
        ck = os.path.join(run, "checkpoints")
        newest = os.path.join(ck, "step_00000012")
        expect_step, expect_text = 8, None
        if kind == "flip-byte":
            f = os.path.join(newest, "model.safetensors")
            data = bytearray(open(f, "rb").read())
            i = self.rng.randrange(len(data) // 2, len(data))
            data[i] ^= 1 << self.rng.randrange(8)
            open(f, "wb").write(bytes(data))
            expect_text = "model.safetensors: checksum mismatch"
        elif kind == "truncate":
            f = os.path.join(newest, "optimizer.safetensors")
            os.truncate(f, os.path.getsize(f) // 2)
            expect_text = "optimizer.safetensors"
        elif kind == "no-latest":
            os.remove(os.path.join(ck, "latest"))
            expect_step, expect_text = 12, "checkpoints/latest is missing"
        elif kind == "disk-full":
            # The next save cannot write its model file: a one-line error naming it, `latest` stays at 12.
            env = self.env()
            p = self.start(self.command(1, cfg, run, ["--resume"]), env, limit_kb=24)
            rc, out, hung = self.finish(p)
            if hung:
                return False, False, True, "hung on a full disk"
            errs = [l for l in out.splitlines() if l.startswith("kvshift: error:")]
            if rc != 1 or len(errs) != 1 or "File too large" not in errs[0] or self.latest_step(run) != 12:
                return False, True, False, f"exit {rc}: " + out.strip()[-200:]
            expect_step, expect_text = 12, None
        out2, hung2, resumed, rc2 = self.resume_until_done(1, cfg, run)
        identical, lost, hung2, note = self.judge(1, run, expect_step, resumed, hung2, out2, rc2)
        if expect_text and expect_text not in out2:
            identical, note = False, f"no '{expect_text}' in the resume's output"
        if resumed != expect_step:
            identical, note = False, f"resumed from step {resumed}, expected {expect_step}"
        return identical, lost, hung2, note


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvshift", required=True)
    ap.add_argument("--short", action="store_true", help="CI's short form: 20 kill trials and one of each other fault")
    ap.add_argument("--kill-trials", type=int, default=None, help="kill trials (default 80, --short 20)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    kills = a.kill_trials if a.kill_trials is not None else (20 if a.short else 80)
    work = a.workdir or tempfile.mkdtemp(prefix="kvs_fault_")
    os.makedirs(work, exist_ok=True)
    h = Harness(a.kvshift, work, random.Random(a.seed))
    t0 = time.time()
    h.reference(1)
    if h.mpirun:
        h.reference(2)
    plan = []
    for i in range(kills):
        dp = 2 if h.mpirun and i % 5 == 4 else 1  # a fifth under mpirun (slower to start), both kinds of kill
        plan.append(("kill-in-save" if i % 2 else "kill", dp, lambda dp=dp, i=i: h.trial_kill(dp, i % 2 == 1)))
    reps = 1 if a.short else 3
    for _ in range(reps):
        plan.append(("sigterm", 1, lambda: h.trial_sigterm(1, False)))
        plan.append(("sigterm-twice", 1, lambda: h.trial_sigterm(1, True)))
        for kind in ("disk-full", "flip-byte", "truncate", "no-latest"):
            plan.append((kind, 1, lambda kind=kind: h.trial_damage(kind)))
        if h.mpirun:
            plan.append(("sigterm", 2, lambda: h.trial_sigterm(2, False)))
            plan.append(("rank-kill", 2, lambda: h.trial_rank(False)))
            plan.append(("rank-hang", 2, lambda: h.trial_rank(True)))
    rows = {}
    failures = []
    for name, dp, fn in plan:
        identical, lost, hung, note = fn()
        key = f"{name} (dp={dp})"
        r = rows.setdefault(key, [0, 0, 0, 0])
        r[0] += 1
        r[1] += identical
        r[2] += lost
        r[3] += hung
        if not identical or lost or hung:
            failures.append(f"{key} #{r[0]}: {note}")
    total = [sum(r[i] for r in rows.values()) for i in range(4)]
    w = max(len(k) for k in rows) + 2
    print(f"\n{'fault':<{w}}{'trials':>8}{'resumed bit-identically':>26}{'data lost':>11}{'hangs':>7}")
    for k, r in rows.items():
        print(f"{k:<{w}}{r[0]:>8}{r[1]:>26}{r[2]:>11}{r[3]:>7}")
    print(f"{'total':<{w}}{total[0]:>8}{total[1]:>26}{total[2]:>11}{total[3]:>7}")
    print(f"\nfault_harness: {total[0]} trials ({kills} kill trials) in {time.time() - t0:.0f} s, seed {a.seed}, "
          f"work directory {work}")
    for f in failures:
        print("  FAILED " + f)
    ok = total[1] == total[0] and total[2] == 0 and total[3] == 0
    print(f"{total[1]} passed, {total[0] - total[1]} failed")
    if ok and a.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
