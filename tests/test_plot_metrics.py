#!/usr/bin/python3
"""Test of scripts/plot_metrics.py on hand-written metrics.jsonl files.

    /usr/bin/python3 tests/test_plot_metrics.py --workdir build/plot_test

Two runs, one of them on blended data (`sources` in its eval lines): the PNG
is written and its path printed; the validation-loss panel holds each run's
curve and, for the blended run only, one thin line per source with that
source's values; a directory without metrics.jsonl is a one-line error.
Prints `N passed, N failed`; exit 1 on any failure. Registered in CTest as
`plot_metrics`.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

from checks import Tally  # tests/checks.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import plot_metrics  # noqa: E402

TALLY = Tally(quiet=False)
check = TALLY.check


def write_run(d, name, sources):
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"name": name, "model": {"kv_shift": {"enabled": True}}, "data": {"type": "shards"}}, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for step in (1, 2, 3, 4):
            f.write(json.dumps({"type": "train", "step": step, "loss": 5.0 - step, "lr": 1e-3, "grad_norm": 1.0}) + "\n")
            if step % 2 == 0:
                e = {"type": "eval", "step": step, "val_loss": 4.0 - step / 2, "accuracy": 0.1, "scored_tokens": 8}
                if sources:
                    e["sources"] = {"web/*.bin": {"val_loss": 5.0 - step, "accuracy": 0.1, "scored_tokens": 6,
                                                  "sequences": 3},
                                    "code/*.bin": {"val_loss": 1.0 / step, "accuracy": 0.5, "scored_tokens": 2,
                                                   "sequences": 1}}
                f.write(json.dumps(e) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    work = parser.parse_args().workdir
    shutil.rmtree(work, ignore_errors=True)
    blend, plain = os.path.join(work, "blend"), os.path.join(work, "plain")
    write_run(blend, "blended", True)
    write_run(plain, "one stream", False)

    out = os.path.join(work, "m.png")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plot_metrics.py"), blend, plain, "--out", out],
                       capture_output=True, text=True)
    check(r.returncode == 0 and r.stdout.strip() == out, "the PNG is written and its path printed", r.stderr)
    check(os.path.getsize(out) > 10000 if os.path.exists(out) else False, "the PNG has a figure in it")

    runs = [plot_metrics.load_run(blend), plot_metrics.load_run(plain)]
    fig = plot_metrics.build_figure(runs, "t", 1)
    val = fig.axes[1]
    lines = {ln.get_label(): ln for ln in val.get_lines()}
    sources = sorted(k for k in lines if k.startswith("_source "))
    check(sources == ["_source code/*.bin", "_source web/*.bin"], "one line per source of the blended run",
          str(sorted(lines)))
    if "_source code/*.bin" in lines:
        ln = lines["_source code/*.bin"]
        check(list(ln.get_xdata()) == [2, 4] and list(ln.get_ydata()) == [0.5, 0.25], "a source's line holds its values",
              "%s %s" % (ln.get_xdata(), ln.get_ydata()))
        check(ln.get_color() == val.get_lines()[0].get_color(), "in its run's colour")
    whole = [ln for ln in val.get_lines() if not ln.get_label().startswith("_source ")]
    check(len(whole) == 2, "each run's own validation curve", str([ln.get_label() for ln in val.get_lines()]))
    legend = val.get_legend()
    check(legend is not None and [t.get_text() for t in legend.get_texts()] == ["all sources", "web/*.bin", "code/*.bin"],
          "the panel names the sources' line styles")

    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plot_metrics.py"), work, "--out", out],
                       capture_output=True, text=True)
    check(r.returncode == 1 and r.stderr.count("\n") == 1 and "no metrics.jsonl" in r.stderr,
          "a directory without metrics.jsonl is a one-line error", r.stderr)

    # The accuracy panel names each task's accuracy as kvshift eval does; many runs never share a colour.
    labels = [plot_metrics.accuracy_labels([{"data_type": t} for t in kinds])[0]
              for kinds in (["hopk"], ["ngram"], ["induction"], ["shards"], ["induction", "hopk"])]
    check(labels == ["hop-k accuracy", "3-gram accuracy", "induction accuracy", "next-token accuracy",
                     "accuracy (hop-k / induction)"], "accuracy titles per task", str(labels))
    check(all(len(set(plot_metrics.distinct_colors(n))) == n for n in (1, 9, 10, 12, 20, 33)),
          "1 to 33 runs: every colour distinct")
    return TALLY.finish()


if __name__ == "__main__":
    sys.exit(main())
