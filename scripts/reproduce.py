#!/usr/bin/python3
"""Reproduce the paper's toy experiments with one command: every sweep, then the results page.

    /usr/bin/python3 scripts/reproduce.py            # the whole suite -> docs/RESULTS.md
    /usr/bin/python3 scripts/reproduce.py --quick    # Figure 1a, one seed per model -> runs/quick/RESULTS.md

It prints the plan and the expected time (from each spec's
estimate_seconds_per_run, for the cells not yet finished) before anything runs,
then runs scripts/sweep.py on each spec (resumable: rerunning the same command
does only the missing cells) and finally scripts/results.py. Errors are one
line, `reproduce: error: ...`, exit code 1. Ctrl-C (or SIGTERM, SIGHUP) stops
the running sweep cleanly (its runs write checkpoints first) and exits 130
(143, 129): run the same command again to continue. See docs/EXPERIMENTS.md.
"""

import argparse
import math
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC_DIR = os.path.join(ROOT, "configs", "experiments")
# The whole suite, in the order it runs (the quick subset's spec first).
FULL = ["fig1a", "fig3", "hopk", "fig1b", "fig8", "fig1a-long", "lm-text"]
# Specs whose data must be prepared first: the command, and the file that says it is done
# (tests/test_sweep.py checks that every spec reading shards under data/ is here).
PREPARE = {
    "lm-text": (["bash", os.path.join(ROOT, "scripts", "prepare_corpus.sh")],
                os.path.join(ROOT, "data", "corpus", "manifest.json")),
    # configs/toy/lm-small-*.json read data/bytes; /usr/bin/python3 because the
    # corpus (the standard library's docs) and so the shards depend on the interpreter.
    "fig8": (["/usr/bin/python3", os.path.join(ROOT, "scripts", "prepare_byte_shards.py")],
             os.path.join(ROOT, "data", "bytes", "manifest.json")),
}
QUICK = ["fig1a"]
QUICK_SEEDS = [1]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="reproduce.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="only Figure 1a with one seed per model (about a minute of training on 2 cores; --dry-run prints the plan)")
    p.add_argument("--jobs", type=int, default=2, help="cells trained in parallel (default 2)")
    p.add_argument("--out", help="sweeps' output root (default runs/experiments, runs/quick with --quick)")
    p.add_argument("--results", help="results page to write (default docs/RESULTS.md, runs/quick/RESULTS.md with --quick)")
    p.add_argument("--kvshift", default=os.path.join(ROOT, "build", "kvshift"), help="the kvshift binary")
    p.add_argument("--spec", action="append", default=[], metavar="NAME",
                   help="run only this experiment (repeatable; names from configs/experiments/)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the expected time; run nothing")
    return p.parse_args(argv)


def plan(names, out_root, seeds, jobs):
    """(name, spec path, cells to run, expected seconds or None) per experiment."""
    rows = []
    for name in names:
        path = os.path.join(SPEC_DIR, name + ".json")
        if not os.path.isfile(path):
            raise sweep.SweepError("%s: no such experiment spec" % path)
        spec = sweep.load_spec(path)
        root = os.path.abspath(os.path.join(out_root, spec["name"]))
        todo = 0
        for g in spec["grid"]:
            for s in spec["seeds"]:
                if seeds and s not in seeds:
                    continue
                c = sweep.Cell(spec, g, s, root)
                c.inspect()
                todo += c.state in ("start", "resume", "restart")
        est = spec.get("estimate_seconds_per_run")
        rows.append((name, path, todo, None if est is None else est * math.ceil(todo / jobs)))
    return rows


class _Stop:
    """The first SIGINT/SIGTERM/SIGHUP this process got, and the step (child) running then."""
    signum = 0
    child = None
    sent = False


def _on_stop_signal(signum, frame):
    if not _Stop.signum:
        _Stop.signum = signum
    _forward_stop()


def _forward_stop():
    """One SIGTERM to the running step: sweep.py then stops its runs, each after a checkpoint.
    (A terminal's Ctrl-C reaches sweep.py too; it ignores a repeated signal.)"""
    child = _Stop.child
    if _Stop.signum and child is not None and not _Stop.sent and child.returncode is None:
        _Stop.sent = True
        try:
            os.kill(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def run_step(cmd, env=None):
    """Run one step to its end, also when this process is asked to stop (the step is then
    asked once, and waited for: subprocess.call would SIGKILL it 0.25 s after a Ctrl-C)."""
    proc = subprocess.Popen(cmd, env=env)
    _Stop.child, _Stop.sent = proc, False
    try:
        _forward_stop()  # a signal that came while it was being started
        return proc.wait()
    finally:
        _Stop.child = None


def interrupted(code):
    print("reproduce: interrupted; run the same command again to continue", file=sys.stderr)
    return code


def main(argv):
    args = parse_args(argv)
    if args.jobs < 1:
        raise sweep.SweepError("--jobs must be >= 1, got %d" % args.jobs)
    names = args.spec or (QUICK if args.quick else FULL)
    seeds = QUICK_SEEDS if args.quick else []
    out_root = os.path.abspath(args.out or os.path.join(ROOT, "runs", "quick" if args.quick else "experiments"))
    results = os.path.abspath(args.results or (os.path.join(out_root, "RESULTS.md") if args.quick
                                               else os.path.join(ROOT, "docs", "RESULTS.md")))
    # prepare_corpus.sh runs from the repository root: a relative path would name another file there.
    kvshift = os.path.abspath(args.kvshift)
    res_dir = os.path.dirname(results)
    if not os.path.isdir(res_dir) and not (res_dir + os.sep).startswith(out_root + os.sep):
        # results.py refuses it too, but only after every sweep has run.
        raise sweep.SweepError("%s: the results page's directory does not exist (--results)" % results)
    rows = plan(names, out_root, seeds, args.jobs)
    total = sum(r[3] or 0 for r in rows)
    what = ("quick subset" if args.quick and not args.spec else "whole suite" if not args.spec
            else "spec%s %s" % ("s" if len(names) > 1 else "", ", ".join(names)))
    print("reproduce: %s, %d jobs -> %s, results %s" % (what, args.jobs, out_root, results))
    for name, _, todo, exp in rows:
        print("  %-11s %3d cells to run  expected %s" % (name, todo, sweep.fmt_duration(exp) if exp is not None else "?"))
    print("  expected time: %s (estimates measured on a 2-core machine; the results page takes a minute more)"
          % sweep.fmt_duration(total))
    if args.dry_run:
        return 0
    sys.stdout.flush()
    start = time.time()
    failed = []
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_stop_signal)
    stopped_codes = (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP)
    for name, path, _, _ in rows:
        if _Stop.signum:
            return interrupted(128 + _Stop.signum)
        if name in PREPARE and not os.path.isfile(PREPARE[name][1]):
            print("reproduce: %s needs its corpus first: %s" % (name, " ".join(PREPARE[name][0])))
            sys.stdout.flush()
            rc = run_step(PREPARE[name][0], env=dict(os.environ, KVSHIFT=kvshift))
            if _Stop.signum:
                return interrupted(128 + _Stop.signum)
            if rc != 0:
                failed.append(name)
                continue
        cmd = [sys.executable, os.path.join(ROOT, "scripts", "sweep.py"), "--spec", path, "--jobs", str(args.jobs),
               "--out", out_root, "--kvshift", kvshift]
        for s in seeds:
            cmd += ["--seed", str(s)]
        rc = run_step(cmd)
        if _Stop.signum or rc in stopped_codes:  # this process was signalled, or sweep.py alone was
            return interrupted(128 + _Stop.signum if _Stop.signum else rc)
        if rc != 0:
            failed.append(name)
    # --update: keep the page's sections of the sweeps not under out_root (runs/ is not in
    # the repository: a fresh clone has none of them, and rerunning one must not erase the others).
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "results.py"), "--experiments", out_root, "--out", results,
           "--kvshift", kvshift, "--update"]
    rc = run_step(cmd)
    if _Stop.signum:
        return interrupted(128 + _Stop.signum)
    if rc != 0:
        failed.append("results")
    print("reproduce: done in %s%s" % (sweep.fmt_duration(time.time() - start),
                                       "; FAILED: " + ", ".join(failed) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except sweep.SweepError as e:
        print("reproduce: error: %s" % e, file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C while planning, before anything ran
        sys.exit(interrupted(130))
