#!/usr/bin/python3
"""Run a multi-seed experiment sweep of `kvshift train` (grid x seeds), resumably.

    /usr/bin/python3 scripts/sweep.py --spec FILE [--kvshift build/kvshift]
        [--out runs/experiments] [--jobs 1] [--dry-run] [--only LABEL ...] [--seed K ...]

The spec (docs/EXPERIMENTS.md) names a base config, overrides for every cell,
a grid of labelled override sets and a list of seeds. Every (label, seed) pair
is one cell, trained into OUT/<name>/<label>/seed<k>. A finished cell is
skipped, an interrupted one is resumed from its checkpoint (or restarted when
it has none), so running the same command again continues a sweep.

Errors in the spec or the arguments are one line, `sweep: error: ...`, exit 1.
A failed cell does not stop the sweep; the exit status is 1 at the end.
Ctrl-C, SIGTERM or SIGHUP stops it: every running kvshift (each in a session
of its own, so a terminal's Ctrl-C does not reach it) gets one SIGTERM,
finishes its step and writes a checkpoint; the cells are recorded as
`interrupted` and the exit status is 128 + the signal (130 for Ctrl-C).
"""

import argparse
import fcntl
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

PROG = "sweep"
SPEC_KEYS = ("name", "description", "base", "set", "grid", "seeds", "seed_keys",
             "estimate_seconds_per_run")
CELL_KEYS = ("label", "set")
DEFAULT_STEPS = 1000  # train.steps default (docs/CONFIG.md)
LOG_NAME = "train.log"  # the cell's kvshift stdout + stderr, inside its run dir
TAIL_LINES = 12
# On SIGINT (Ctrl-C), SIGTERM or SIGHUP every running kvshift gets one SIGTERM, a
# request to finish its step and write a checkpoint (a second one would make it
# exit at once without one, docs/RELIABILITY.md), and this long to do it.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_TIMEOUT_S = 120
EXIT_STOPPED = 75  # kvshift's exit status after a stop-signal checkpoint


class SweepError(Exception):
    """A problem with the spec, the arguments or the output directory: one line."""


# ----------------------------------------------------------------------------
# The spec


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _check_name(value, what, path):
    if not isinstance(value, str) or not value:
        raise SweepError("%s: %s must be a non-empty string, got %s" % (path, what, json.dumps(value)))
    if value in (".", "..") or not all(c.isalnum() or c in "-_.+" for c in value):
        raise SweepError("%s: %s %s may only contain letters, digits and - _ . + (it names a directory)"
                         % (path, what, json.dumps(value)))


def _check_set(value, what, path):
    if not isinstance(value, dict):
        raise SweepError("%s: %s must be an object of \"key.path\": value, got %s"
                         % (path, what, json.dumps(value)))
    for key in value:
        if not key or "=" in key or key.startswith(".") or key.endswith(".") or ".." in key:
            raise SweepError("%s: %s: invalid config key %s" % (path, what, json.dumps(key)))


def load_spec(path):
    """Read and validate a spec file; return it as a dict with defaults filled in."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SweepError("%s: cannot read spec: %s" % (path, e.strerror or e))
    except UnicodeDecodeError as e:
        raise SweepError("%s: not UTF-8 text (byte 0x%02x at offset %d)" % (path, e.object[e.start], e.start))

    def no_duplicates(pairs):
        seen = {}
        for k, v in pairs:
            if k in seen:
                raise SweepError("%s: duplicate key '%s'" % (path, k))
            seen[k] = v
        return seen

    def no_constant(name):  # NaN, Infinity: not JSON, though Python's parser takes them
        raise SweepError("%s: invalid JSON: %s is not a number JSON has" % (path, name))

    try:
        spec = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except ValueError as e:
        raise SweepError("%s: invalid JSON: %s" % (path, e))
    if not isinstance(spec, dict):
        raise SweepError("%s: the spec must be a JSON object" % path)
    for key in spec:
        if key not in SPEC_KEYS:
            raise SweepError("%s: unknown key '%s' (known: %s)" % (path, key, ", ".join(SPEC_KEYS)))
    for key in ("name", "base", "grid", "seeds"):
        if key not in spec:
            raise SweepError("%s: missing required key '%s'" % (path, key))

    _check_name(spec["name"], "name", path)
    spec.setdefault("description", "")
    if not isinstance(spec["description"], str):
        raise SweepError("%s: description must be a string" % path)
    if not isinstance(spec["base"], str) or not spec["base"]:
        raise SweepError("%s: base must be a path (relative to the spec file)" % path)
    base = os.path.join(os.path.dirname(os.path.abspath(path)), spec["base"])
    if not os.path.isfile(base):
        raise SweepError("%s: base config %s %s" % (path, base, "is a directory, not a config file"
                                                    if os.path.isdir(base) else "does not exist"))
    spec["base_path"] = os.path.normpath(base)
    spec.setdefault("set", {})
    _check_set(spec["set"], "set", path)

    grid = spec["grid"]
    if not isinstance(grid, list) or not grid:
        raise SweepError("%s: grid must be a non-empty array of {\"label\", \"set\"} objects" % path)
    labels = set()
    for i, cell in enumerate(grid):
        if not isinstance(cell, dict):
            raise SweepError("%s: grid[%d] must be an object" % (path, i))
        for key in cell:
            if key not in CELL_KEYS:
                raise SweepError("%s: unknown key 'grid[%d].%s' (known: %s)"
                                 % (path, i, key, ", ".join(CELL_KEYS)))
        if "label" not in cell:
            raise SweepError("%s: grid[%d]: missing required key 'label'" % (path, i))
        _check_name(cell["label"], "grid[%d].label" % i, path)
        if cell["label"] in labels:
            raise SweepError("%s: grid[%d]: duplicate label '%s'" % (path, i, cell["label"]))
        labels.add(cell["label"])
        cell.setdefault("set", {})
        _check_set(cell["set"], "grid[%d].set" % i, path)

    seeds = spec["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(_is_int(s) and s >= 0 for s in seeds):
        raise SweepError("%s: seeds must be a non-empty array of non-negative integers" % path)
    if len(set(seeds)) != len(seeds):
        raise SweepError("%s: seeds contain a duplicate" % path)
    spec.setdefault("seed_keys", ["train.seed"])
    sk = spec["seed_keys"]
    if not isinstance(sk, list) or not sk or not all(isinstance(k, str) and k for k in sk):
        raise SweepError("%s: seed_keys must be a non-empty array of config keys (strings): without one, every "
                         "seed would train the same run" % path)
    est = spec.get("estimate_seconds_per_run")
    if est is not None and (isinstance(est, bool) or not isinstance(est, (int, float)) or not 0 < est < 1e9):
        raise SweepError("%s: estimate_seconds_per_run must be a positive number of seconds (below 1e9)" % path)
    return spec


def _get_path(obj, dotted):
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None, False
        obj = obj[part]
    return obj, True


def _same_value(a, b):
    """JSON equality that keeps booleans apart from numbers and allows float round-off."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or math.isclose(a, b, rel_tol=1e-6, abs_tol=0.0)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    return a == b


# ----------------------------------------------------------------------------
# Cells


class Cell:
    def __init__(self, spec, grid_entry, seed, out_root):
        self.label = grid_entry["label"]
        self.seed = seed
        self.run_dir = os.path.join(out_root, self.label, "seed%d" % seed)
        # Overrides in order; a later one wins: the spec's, the cell's, the seed.
        self.overrides = list(spec["set"].items()) + list(grid_entry["set"].items())
        self.overrides += [(k, seed) for k in spec["seed_keys"]]
        with open(spec["base_path"], encoding="utf-8") as f:
            try:
                base = json.load(f)
            except ValueError:
                base = {}
        steps, found = _get_path(base, "train.steps")
        intended = dict(self.overrides)
        self.steps = intended.get("train.steps", steps if found else DEFAULT_STEPS)
        self.intended = intended
        self.base_dir = os.path.dirname(os.path.abspath(spec["base_path"]))  # where kvshift resolves relative paths
        # Filled in by inspect() and run():
        self.state = None      # finished | start | resume | restart | stale
        self.reason = ""
        self.status = None     # finished | failed | stale | interrupted | todo | running
        self.action = None     # skipped | started | resumed | restarted (this invocation)
        self.wall_s = None
        self.returncode = None
        self.error = None

    @property
    def name(self):
        return "%s seed%d" % (self.label, self.seed)

    def set_args(self):
        args = []
        for key, value in self.overrides:
            args += ["--set", "%s=%s" % (key, json.dumps(value))]
        return args

    # -- reading the run directory -------------------------------------------

    def read_metrics(self):
        """(last train step or None, list of eval dicts) from metrics.jsonl; bad lines are skipped."""
        last_train, evals = None, []
        try:
            with open(os.path.join(self.run_dir, "metrics.jsonl"), encoding="utf-8") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if not isinstance(rec, dict):
                        continue
                    if rec.get("type") == "train" and _is_int(rec.get("step")):
                        last_train = rec["step"] if last_train is None else max(last_train, rec["step"])
                    elif rec.get("type") == "eval":
                        evals.append(rec)
        except OSError:
            pass
        return last_train, evals

    def read_config(self):
        try:
            with open(os.path.join(self.run_dir, "config.json"), encoding="utf-8") as f:
                cfg = json.load(f)
            return cfg if isinstance(cfg, dict) else None
        except (OSError, ValueError):
            return None

    def checkpoint_step(self):
        """The step of checkpoints/latest, or None when there is no (valid) latest."""
        try:
            with open(os.path.join(self.run_dir, "checkpoints", "latest"), encoding="utf-8") as f:
                name = f.read().strip()
        except OSError:
            return None
        if not name.startswith("step_") or not name[5:].isdigit():
            return None
        if not os.path.isdir(os.path.join(self.run_dir, "checkpoints", name)):
            return None
        return int(name[5:])

    def final_eval(self):
        _, evals = self.read_metrics()
        if not evals:
            return None
        last = max(evals, key=lambda e: e.get("step", -1))
        return {k: last.get(k) for k in ("step", "val_loss", "accuracy")}

    def inspect(self):
        """Decide what this cell needs: finished, start, resume, restart or stale."""
        if not os.path.isdir(self.run_dir):
            self.state, self.reason = "start", "no run directory"
            return
        cfg = self.read_config()
        ckpt = self.checkpoint_step()
        if cfg is None:
            if ckpt is None:
                self.state, self.reason = "restart", "no config.json and no checkpoint"
            else:
                self.state, self.reason = "stale", "has a checkpoint but no readable config.json"
            return
        # The run must have been made with the spec's overrides (train.steps may grow).
        for key, want in self.intended.items():
            if key == "train.steps" or key.startswith("data.shards."):
                continue  # steps may grow; shard paths (globs) are made absolute
            if key == "train.threads":
                continue  # the sweep's own (cores / jobs); a resumed cell keeps its first (command())
            have, found = _get_path(cfg, key)
            if key == "data.tokenizer" and isinstance(want, str) and want:
                # kvshift records it made absolute (relative paths are the base config's directory's).
                want = os.path.normpath(os.path.join(self.base_dir, want))
            if not found or not _same_value(have, want):
                self.state = "stale"
                self.reason = ("its config.json has %s=%s but the spec says %s; delete %s to rerun it"
                               % (key, json.dumps(have) if found else "(missing)", json.dumps(want),
                                  self.run_dir))
                return
        configured, _ = _get_path(cfg, "train.steps")
        last_train, _ = self.read_metrics()
        if ckpt is not None and configured == self.steps and ckpt == self.steps and last_train == self.steps:
            self.state, self.reason = "finished", ""
        elif ckpt is not None and ckpt > self.steps:
            self.state = "stale"
            self.reason = ("its checkpoint is at step %d, beyond the spec's train.steps %d; delete %s to rerun it"
                           % (ckpt, self.steps, self.run_dir))
        elif ckpt is not None and ckpt < self.steps:
            self.state, self.reason = "resume", "checkpoint at step %d of %d" % (ckpt, self.steps)
        else:
            # No checkpoint, or a final checkpoint without the final metrics line: start over.
            self.state = "restart"
            self.reason = ("no checkpoint" if ckpt is None
                           else "final checkpoint but metrics.jsonl lacks step %d" % self.steps)

    def to_json(self):
        fe = self.final_eval() if os.path.isdir(self.run_dir) else None
        return {
            "label": self.label,
            "seed": self.seed,
            "run_dir": self.run_dir,
            "status": self.status,
            "action": self.action,
            "steps": self.steps,
            "overrides": {k: v for k, v in self.overrides},
            "wall_s": None if self.wall_s is None else round(self.wall_s, 3),
            "returncode": self.returncode,
            "error": self.error,
            "final_eval": fe,
        }


# ----------------------------------------------------------------------------
# Output


def exit_text(code):
    """'exit status 1', or 'killed by SIGKILL' for a process a signal ended (Popen's negative code)."""
    if code < 0:
        try:
            return "killed by %s" % signal.Signals(-code).name
        except ValueError:
            return "killed by signal %d" % -code
    return "exit status %d" % code


def fmt_duration(seconds):
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm" % round(s / 60) if s >= 600 else "%dm%02ds" % (s // 60, s % 60)
    return "%dh%02dm" % (s // 3600, (s % 3600) // 60)


def atomic_write_json(path, obj):
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".sweep.json.", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def tail(path, n):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().replace("\r", "\n").splitlines()
    except OSError:
        return []
    return [l for l in lines if l.strip()][-n:]


# ----------------------------------------------------------------------------
# Main


def parse_args(argv):
    p = argparse.ArgumentParser(prog="sweep.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", required=True, help="experiment spec (JSON), see docs/EXPERIMENTS.md")
    p.add_argument("--kvshift", default="build/kvshift", help="the kvshift binary (default build/kvshift)")
    p.add_argument("--out", default="runs/experiments", help="output root; cells go to OUT/<name>/<label>/seed<k>")
    p.add_argument("--jobs", type=int, default=1, help="cells run in parallel (default 1)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the commands; run nothing")
    p.add_argument("--only", action="append", default=[], metavar="LABEL",
                   help="run only the cells of this label (repeatable); sweep.json still lists every cell")
    p.add_argument("--seed", action="append", default=[], type=int, metavar="K", dest="only_seeds",
                   help="run only the cells of this seed (repeatable; combines with --only)")
    return p.parse_args(argv)


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def main(argv):
    args = parse_args(argv)
    if args.jobs < 1:
        raise SweepError("--jobs must be >= 1, got %d" % args.jobs)
    spec = load_spec(args.spec)
    labels = [g["label"] for g in spec["grid"]]
    for lab in args.only:
        if lab not in labels:
            raise SweepError("--only %s: no such label in %s (labels: %s)" % (lab, args.spec, ", ".join(labels)))
    for k in args.only_seeds:
        if k not in spec["seeds"]:
            raise SweepError("--seed %d: no such seed in %s (seeds: %s)"
                             % (k, args.spec, ", ".join(str(x) for x in spec["seeds"])))
    kvshift = os.path.abspath(args.kvshift)
    if not args.dry_run and not (os.path.isfile(kvshift) and os.access(kvshift, os.X_OK)):
        raise SweepError("%s: kvshift binary not found or not executable (build it: scripts/build.sh)" % kvshift)

    out_root = os.path.abspath(os.path.join(args.out, spec["name"]))
    cells = [Cell(spec, g, s, out_root) for g in spec["grid"] for s in spec["seeds"]]
    for c in cells:
        c.inspect()
        c.status = {"finished": "finished", "stale": "stale"}.get(c.state, "todo")
    selected = [c for c in cells if (not args.only or c.label in args.only)
                and (not args.only_seeds or c.seed in args.only_seeds)]
    todo = [c for c in selected if c.state in ("start", "resume", "restart")]
    stale = [c for c in selected if c.state == "stale"]
    n_finished = sum(c.state == "finished" for c in cells)

    threads = max(1, cpu_count() // args.jobs)
    est = spec.get("estimate_seconds_per_run")
    expected = None if est is None else est * math.ceil(len(todo) / args.jobs)
    print("sweep %s: %d cells (%d labels x %d seeds), %d finished, %d todo%s -> %s"
          % (spec["name"], len(cells), len(labels), len(spec["seeds"]), n_finished, len(todo),
             (", %d stale" % len(stale)) if stale else "", out_root))
    if args.only or args.only_seeds:
        what = ", ".join(args.only + ["seed%d" % k for k in args.only_seeds])
        print("  only: %s (%d of %d cells)" % (what, len(selected), len(cells)))
    def threads_of(c):
        # A run is bit-identical only at one thread count (docs/ARCHITECTURE.md): a resumed cell keeps the
        # count it started with, whatever --jobs is now.
        started, _ = _get_path(c.read_config() or {}, "train.threads") if c.state == "resume" else (None, False)
        return started if isinstance(started, int) and not isinstance(started, bool) and started > 0 else threads

    if todo:
        counts = sorted({threads_of(c) for c in todo})
        kept = sum(threads_of(c) != threads for c in todo)
        print("  expected time: %s (%d todo x %s per run / %d jobs, %s)"
              % (fmt_duration(expected) if expected is not None else "unknown (no estimate_seconds_per_run)",
                 len(todo), fmt_duration(est) if est else "?", args.jobs,
                 "%d threads each" % threads if not kept else "%d threads each; %d resumed cell%s keep%s the %s "
                 "%s started with" % (threads, kept, "s" if kept > 1 else "", "" if kept > 1 else "s",
                                      "/".join(str(n) for n in counts if n != threads), "they" if kept > 1 else "it")))
    for c in stale:
        print("  stale: %s: %s" % (c.name, c.reason))

    def command(c):
        # The run name and the thread count first, so that the spec's own values win.
        cmd = [kvshift, "train", "--config", spec["base_path"],
               "--set", "name=%s" % json.dumps("%s-%s-seed%d" % (spec["name"], c.label, c.seed)),
               "--set", "train.threads=%d" % threads_of(c)]
        cmd += c.set_args() + ["--run-dir", c.run_dir, "--quiet"]
        if c.state == "resume":
            cmd.append("--resume")
        return cmd

    if args.dry_run:
        for c in todo:
            print("  %s (%s%s):" % (c.name, c.state, ": " + c.reason if c.reason else ""))
            print("    " + " ".join(_shell_quote(a) for a in command(c)))
        return 1 if stale else 0

    try:
        os.makedirs(out_root, exist_ok=True)
    except OSError as e:
        raise SweepError("%s: cannot create the sweep's directory: %s" % (out_root, e.strerror or e))
    lock = open(os.path.join(out_root, ".sweep.lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise SweepError("%s: another sweep is running on this directory" % out_root)

    for c in cells:
        if c.state == "finished":
            c.action = "skipped"
    previous = _read_previous(os.path.join(out_root, "sweep.json"))
    for c in cells:  # keep the wall time of cells that finished in an earlier invocation
        prev = previous.get((c.label, c.seed))
        if prev and c.state == "finished":
            c.wall_s = prev.get("wall_s")

    sweep_json = os.path.join(out_root, "sweep.json")

    def write_sweep_json():
        atomic_write_json(sweep_json, {
            "name": spec["name"],
            "description": spec["description"],
            "spec": os.path.abspath(args.spec),
            "base": spec["base_path"],
            "kvshift": kvshift,
            "seeds": spec["seeds"],
            "labels": labels,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cells": [c.to_json() for c in cells],
        })

    write_sweep_json()
    durations = []
    done_count = n_finished
    failed = list(stale)
    stopped = []  # cells that exited 75: their own stop signal, after a checkpoint
    pending = list(todo)
    running = {}  # Popen -> (cell, start time, log file)

    def launch(c):
        if c.state in ("restart",):
            shutil.rmtree(c.run_dir)
        os.makedirs(c.run_dir, exist_ok=True)
        log = open(os.path.join(c.run_dir, LOG_NAME), "a" if c.state == "resume" else "w", encoding="utf-8")
        cmd = command(c)
        log.write("$ %s\n" % " ".join(_shell_quote(a) for a in cmd))
        log.flush()
        # A session of its own: a terminal's Ctrl-C (or a signal to this process
        # group) reaches only sweep.py, which sends each run exactly one stop request.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        c.status = "running"
        c.action = {"start": "started", "resume": "resumed", "restart": "restarted"}[c.state]
        running[proc] = (c, time.monotonic(), log)

    stop = _StopRequest()
    stop.install()
    try:
        while (pending or running) and not stop.signum:
            while pending and len(running) < args.jobs and not stop.signum:
                launch(pending.pop(0))
            write_sweep_json()
            proc = _wait_any(running, stop)
            if proc is None:
                break  # a stop signal
            c, t0, log = running.pop(proc)
            log.close()
            c.wall_s = time.monotonic() - t0
            c.returncode = proc.returncode
            c.inspect()
            done_count += 1
            remaining = len(pending) + len(running)
            if proc.returncode == 0 and c.state == "finished":
                c.status = "finished"
                durations.append(c.wall_s)
                eta = statistics.median(durations) * math.ceil(remaining / args.jobs) if remaining else 0
                fe = c.final_eval() or {}
                acc = fe.get("accuracy")
                print("[%d/%d] %s %s: %s, final accuracy %s, ETA %s"
                      % (done_count, len(cells), spec["name"], c.name, fmt_duration(c.wall_s),
                         "%.1f%%" % (100 * acc) if isinstance(acc, (int, float)) else "n/a",
                         fmt_duration(eta)), flush=True)
            elif proc.returncode == EXIT_STOPPED:
                # Its own stop signal (e.g. a scheduler's SIGTERM or SIGUSR1 to the trainer, not to
                # sweep.py): it wrote a checkpoint, and a rerun resumes it.
                c.status = "interrupted"
                c.error = "stopped by a signal after its checkpoint (exit status %d); next: %s%s" % (
                    EXIT_STOPPED, c.state, ", " + c.reason if c.reason else "")
                stopped.append(c)
                print("[%d/%d] %s %s: %s" % (done_count, len(cells), spec["name"], c.name, c.error), flush=True)
            else:
                c.status = "failed"
                how = exit_text(proc.returncode)
                c.error = how if proc.returncode != 0 else "exited 0 but the run is not finished (%s)" % c.reason
                failed.append(c)
                lines = tail(os.path.join(c.run_dir, LOG_NAME), TAIL_LINES)
                # Its error line; none when it was killed (an out-of-memory kill, say): no other line stands in.
                last_err = next((l for l in reversed(lines) if "error" in l.lower()), "")
                c.error += ": " + last_err.strip() if last_err else ""
                print("[%d/%d] %s %s: FAILED after %s (%s); last lines of %s:"
                      % (done_count, len(cells), spec["name"], c.name, fmt_duration(c.wall_s),
                         how, os.path.join(c.run_dir, LOG_NAME)), flush=True)
                for line in lines:
                    print("    " + line, flush=True)
            write_sweep_json()
    finally:
        # A stop signal, or an error in this script: no run is left behind, and
        # sweep.json says where each one got to (never `running`).
        if running or stop.signum:
            _stop_cells(running, stop.signum)
            write_sweep_json()
    if stop.signum:
        name = signal.Signals(stop.signum).name
        _say("sweep %s: interrupted by %s; run the same command again to resume" % (spec["name"], name))
        return 128 + stop.signum

    n_done = sum(c.status == "finished" for c in cells)
    print("sweep %s: %d/%d cells finished, %d failed%s%s; %s"
          % (spec["name"], n_done, len(cells), len(failed),
             (" (%s)" % ", ".join(c.name for c in failed)) if failed else "",
             (", %d stopped by a signal (%s; run the same command again to resume)"
              % (len(stopped), ", ".join(c.name for c in stopped))) if stopped else "", sweep_json))
    return 1 if failed or stopped else 0


def _wait_any(running, stop):
    """Block until one of the running processes exits and return it; None on a stop signal."""
    while True:
        for proc in running:
            if proc.poll() is not None:
                return proc
        if stop.signum:
            return None
        time.sleep(0.05)


class _StopRequest:
    """The first SIGINT/SIGTERM/SIGHUP; the handler only records it (the main loop acts on it).
    Later ones are ignored: the runs have had their stop request and are writing checkpoints."""

    def __init__(self):
        self.signum = 0

    def install(self):
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        if not self.signum:
            self.signum = signum


def _stop_cells(running, signum):
    """One SIGTERM to every running kvshift, then wait (STOP_TIMEOUT_S in all) for its checkpoint.

    Each cell is then recorded from its run directory: finished when the run got to its
    end anyway, interrupted otherwise (a rerun resumes it from the checkpoint it wrote,
    or restarts it when it had none)."""
    name = signal.Signals(signum).name if signum else "an error in sweep.py"
    if running:
        _say("sweep: %s: stopping %d run%s (each writes a checkpoint first; up to %ds; "
             "further signals are ignored)"
             % (name, len(running), "" if len(running) == 1 else "s", STOP_TIMEOUT_S))
    for proc in running:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc, (c, t0, log) in list(running.items()):
        killed = False
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed = True
        log.close()
        c.wall_s = time.monotonic() - t0
        c.returncode = proc.returncode
        c.inspect()
        if proc.returncode == 0 and c.state == "finished":
            c.status = "finished"
            continue
        c.status = "interrupted"
        how = ("killed after %ds without exiting" % STOP_TIMEOUT_S if killed
               else "exit status %d%s" % (proc.returncode,
                                          " after its checkpoint" if proc.returncode == EXIT_STOPPED else ""))
        c.error = "stopped by %s (%s); next: %s%s" % (name, how, c.state, ", " + c.reason if c.reason else "")
        _say("  %s: %s" % (c.name, c.error))
    running.clear()


def _say(line):
    """A line on stderr that may have gone with its terminal (SIGHUP)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _read_previous(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return {(c["label"], c["seed"]): c for c in data.get("cells", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _shell_quote(s):
    return shlex.quote(s)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SweepError as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C before any run was started
        print("%s: interrupted" % PROG, file=sys.stderr)
        sys.exit(130)
