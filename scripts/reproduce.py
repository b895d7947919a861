#!/usr/bin/python3
"""Reproduce the paper's toy experiments with one command: every sweep, then the results page.

    /usr/bin/python3 scripts/reproduce.py            # the whole suite -> docs/RESULTS.md
    /usr/bin/python3 scripts/reproduce.py --quick    # Figure 1a, one seed per model -> runs/quick/RESULTS.md

It prints the plan and the expected time (from each spec's
estimate_seconds_per_run, for the cells not yet finished) before anything runs,
then runs scripts/sweep.py on each spec (resumable: rerunning the same command
does only the missing cells) and finally scripts/results.py. Errors are one
line, `reproduce: error: ...`, exit code 1. See docs/EXPERIMENTS.md.
"""

import argparse
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC_DIR = os.path.join(ROOT, "configs", "experiments")
# The whole suite, in the order it runs (the quick subset's spec first).
FULL = ["fig1a", "fig3", "hopk", "fig1b", "fig8", "fig1a-long", "lm-text"]
# Specs whose data must be prepared first: the command, and the file that says it is done.
PREPARE = {"lm-text": (["bash", os.path.join(ROOT, "scripts", "prepare_corpus.sh")],
                       os.path.join(ROOT, "data", "corpus", "manifest.json"))}
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


def main(argv):
    args = parse_args(argv)
    if args.jobs < 1:
        raise sweep.SweepError("--jobs must be >= 1, got %d" % args.jobs)
    names = args.spec or (QUICK if args.quick else FULL)
    seeds = QUICK_SEEDS if args.quick else []
    out_root = args.out or os.path.join(ROOT, "runs", "quick" if args.quick else "experiments")
    results = args.results or (os.path.join(out_root, "RESULTS.md") if args.quick
                               else os.path.join(ROOT, "docs", "RESULTS.md"))
    rows = plan(names, out_root, seeds, args.jobs)
    total = sum(r[3] or 0 for r in rows)
    print("reproduce: %s, %d jobs -> %s, results %s" % ("quick subset" if args.quick else "whole suite",
                                                          args.jobs, out_root, results))
    for name, _, todo, exp in rows:
        print("  %-11s %3d cells to run  expected %s" % (name, todo, sweep.fmt_duration(exp) if exp is not None else "?"))
    print("  expected time: %s (estimates measured on a 2-core machine; the results page takes a minute more)"
          % sweep.fmt_duration(total))
    if args.dry_run:
        return 0
    sys.stdout.flush()
    start = time.time()
    failed = []
    for name, path, _, _ in rows:
        if name in PREPARE and not os.path.isfile(PREPARE[name][1]):
            print("reproduce: %s needs its corpus first: %s" % (name, " ".join(PREPARE[name][0])))
            sys.stdout.flush()
            if subprocess.call(PREPARE[name][0], env=dict(os.environ, KVSHIFT=args.kvshift)) != 0:
                failed.append(name)
                continue
        cmd = [sys.executable, os.path.join(ROOT, "scripts", "sweep.py"), "--spec", path, "--jobs", str(args.jobs),
               "--out", out_root, "--kvshift", args.kvshift]
        for s in seeds:
            cmd += ["--seed", str(s)]
        rc = subprocess.call(cmd)
        if rc == 130:
            print("reproduce: interrupted; run the same command again to continue", file=sys.stderr)
            return 130
        if rc != 0:
            failed.append(name)
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "results.py"), "--experiments", out_root, "--out", results,
           "--kvshift", args.kvshift]
    if subprocess.call(cmd) != 0:
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
