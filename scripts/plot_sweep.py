#!/usr/bin/python3
"""Plot a multi-seed sweep (scripts/sweep.py) and print its results table.

    /usr/bin/python3 scripts/plot_sweep.py --sweep OUT/<name> --out FILE.png
        [--metric accuracy|val_loss] [--x step|tokens] [--band minmax|std]
    /usr/bin/python3 scripts/plot_sweep.py --sweep OUT/<name> --table-only

Reads every cell's metrics.jsonl (OUT/<name>/<label>/seed<k>/), groups the
cells by label and plots, per label, the mean over seeds of the eval metric
against the step (or trained tokens) with a shaded band: min-max over the
seeds (default) or mean +- 1 std. At a step where only some seeds have an
eval (an unfinished cell), the mean is over those that do.

The table (Markdown) has per label: seeds with data, finished seeds, final
accuracy and val_loss (mean +- std over seeds, each seed's last eval), the
steps to 90% accuracy per seed (first eval step with accuracy >= 0.9, "—" if
never) and their mean over the seeds that got there.

The label order is the spec's (from sweep.json) when there is one, else
alphabetical. Errors are one line, `plot_sweep: error: ...`, exit code 1.
"""

import argparse
import json
import math
import os
import re
import sys

import numpy as np

PROG = "plot_sweep"
THRESHOLD = 0.9
DASH = "\u2014"


class PlotError(Exception):
    pass


# ----------------------------------------------------------------------------
# Reading


def read_metrics(run_dir):
    """(eval records sorted by step, last train step) of one run; unparsable lines skipped."""
    evals, last_train = {}, None
    path = os.path.join(run_dir, "metrics.jsonl")
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
                    continue
                if rec.get("type") == "eval":
                    evals[rec["step"]] = rec  # a resumed run logs each step once; keep the last anyway
                elif rec.get("type") == "train":
                    last_train = rec["step"] if last_train is None else max(last_train, rec["step"])
    except OSError:
        return None, None
    return [evals[s] for s in sorted(evals)], last_train


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def discover(sweep_dir):
    """[(label, seed, run_dir, status)] in spec order, and the sweep's name."""
    if not os.path.isdir(sweep_dir):
        raise PlotError("%s: no such sweep directory" % sweep_dir)
    meta_path = os.path.join(sweep_dir, "sweep.json")
    meta = read_json(meta_path)
    name = os.path.basename(os.path.normpath(sweep_dir))
    cells = []
    usable = isinstance(meta, dict) and isinstance(meta.get("cells"), list)
    if not usable and os.path.exists(meta_path):
        print("plot_sweep: warning: %s cannot be read as a sweep's record (not JSON, or no \"cells\"): the "
              "cells are taken from the <label>/seed<k>/ directories, in name order" % meta_path, file=sys.stderr)
    if usable:
        name = meta.get("name", name)
        for c in meta["cells"]:
            try:
                cells.append((c["label"], int(c["seed"]),
                              os.path.join(sweep_dir, c["label"], "seed%d" % int(c["seed"])), c.get("status")))
            except (KeyError, TypeError, ValueError):
                continue
    else:
        for label in sorted(os.listdir(sweep_dir)):
            ldir = os.path.join(sweep_dir, label)
            if not os.path.isdir(ldir):
                continue
            for seed_dir in sorted(os.listdir(ldir)):
                m = re.fullmatch(r"seed(\d+)", seed_dir)
                if m:
                    cells.append((label, int(m.group(1)), os.path.join(ldir, seed_dir), None))
        cells.sort(key=lambda c: (c[0], c[1]))
    if not cells:
        raise PlotError("%s: no cells (neither sweep.json nor <label>/seed<k>/ directories)" % sweep_dir)
    return name, cells


def load(sweep_dir, x_axis):
    name, cells = discover(sweep_dir)
    groups = {}  # label -> list of seed dicts
    for label, seed, run_dir, status in cells:
        evals, last_train = read_metrics(run_dir)
        cfg = read_json(os.path.join(run_dir, "config.json")) or {}
        train = cfg.get("train", {}) if isinstance(cfg, dict) else {}
        steps = train.get("steps")
        tokens_per_step = None
        try:
            tokens_per_step = train["micro_batch_size"] * train["grad_accum_steps"] * train["seq_len"]
        except (KeyError, TypeError):
            pass
        finished = status == "finished" if status is not None else (steps is not None and last_train == steps)
        g = groups.setdefault(label, [])
        if not evals:
            g.append({"seed": seed, "evals": [], "finished": False, "final": False, "steps": steps})
            continue
        if x_axis == "tokens" and tokens_per_step is None:
            raise PlotError("%s: config.json lacks the batch shape needed for --x tokens" % run_dir)
        # "final": the run finished and its last evaluation is at its last step; only such seeds give
        # final numbers (an interrupted seed's last eval is from an earlier step, as is a finished
        # seed's whose final eval line was cut).
        g.append({"seed": seed, "evals": evals, "finished": finished, "steps": steps,
                  "final": finished and steps is not None and evals[-1]["step"] == steps,
                  "scale": tokens_per_step if x_axis == "tokens" else 1})
    return name, groups


# ----------------------------------------------------------------------------
# Statistics and table


def mean_std(values):
    v = [x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return None, None
    return float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0


def steps_to(evals, threshold=THRESHOLD):
    for e in evals:
        acc = e.get("accuracy")
        if isinstance(acc, (int, float)) and acc >= threshold:
            return e["step"]
    return None


def table(groups):
    rows = ["| label | seeds | final accuracy | final val_loss | steps to 90%% accuracy (per seed) | mean steps to 90%% |",
            "|---|---|---|---|---|---|"]
    rows = [r.replace("%%", "%") for r in rows]
    for label, seeds in groups.items():
        with_data = [s for s in seeds if s["final"]]  # final numbers: the seeds with an eval at their last step
        n_fin = sum(s["finished"] for s in seeds)
        accs = [s["evals"][-1].get("accuracy") for s in with_data]
        losses = [s["evals"][-1].get("val_loss") for s in with_data]
        am, asd = mean_std(accs)
        lm, lsd = mean_std(losses)
        reach = [(s["seed"], steps_to(s["evals"])) for s in with_data]
        per_seed = ", ".join("s%d: %s" % (seed, DASH if st is None else st) for seed, st in reach) or DASH
        got = [st for _, st in reach if st is not None]
        if got:
            mean_reach = "%.0f" % np.mean(got)
            if len(got) < len(reach):
                mean_reach += " (%d/%d seeds)" % (len(got), len(reach))
        else:
            mean_reach = DASH
        seeds_txt = "%d" % len(with_data)
        if n_fin != len(seeds) or len(with_data) != len(seeds):
            seeds_txt += " (%d/%d finished)" % (n_fin, len(seeds))
        rows.append("| %s | %s | %s | %s | %s | %s |" % (
            label, seeds_txt,
            DASH if am is None else "%.1f%% ± %.1f" % (100 * am, 100 * asd),
            DASH if lm is None else "%.4f ± %.4f" % (lm, lsd),
            per_seed, mean_reach))
    return "\n".join(rows)


# ----------------------------------------------------------------------------
# Plot


def plot(name, groups, metric, x_axis, band, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import plot_metrics  # scripts/plot_metrics.py: its save_atomically

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    colors = plot_metrics.distinct_colors(len(groups))
    scale_y = 100.0 if metric == "accuracy" else 1.0
    drawn = 0
    for i, (label, seeds) in enumerate(groups.items()):
        series = [s for s in seeds if s["evals"]]
        if not series:
            continue
        xs = sorted({e["step"] * s["scale"] for s in series for e in s["evals"]})
        per_x = {x: [] for x in xs}
        for s in series:
            for e in s["evals"]:
                v = e.get(metric)
                if isinstance(v, (int, float)) and math.isfinite(v):
                    per_x[e["step"] * s["scale"]].append(v * scale_y)
        xs = [x for x in xs if per_x[x]]
        if not xs:
            continue
        vals = [np.array(per_x[x]) for x in xs]
        mean = np.array([v.mean() for v in vals])
        if band == "std":
            sd = np.array([v.std(ddof=1) if len(v) > 1 else 0.0 for v in vals])
            lo, hi = mean - sd, mean + sd
        else:
            lo, hi = np.array([v.min() for v in vals]), np.array([v.max() for v in vals])
        color = colors[i]
        ax.plot(xs, mean, color=color, lw=2, marker="o" if len(xs) <= 30 else None, ms=3,
                label="%s (n=%d)" % (label, len(series)))
        ax.fill_between(xs, lo, hi, color=color, alpha=0.2, lw=0)
        drawn += 1
    if not drawn:
        raise PlotError("no eval lines with %s in any cell" % metric)
    band_txt = "band: min–max over seeds" if band == "minmax" else "band: mean ± 1 std over seeds"
    ylabel = "accuracy (%)" if metric == "accuracy" else "validation loss"
    ax.set_title("%s: %s, mean over seeds (%s)" % (name, ylabel, band_txt.replace("band: ", "shaded: ")),
                 fontsize=11)
    ax.set_xlabel("optimizer step" if x_axis == "step" else "training tokens")
    if x_axis == "tokens":
        ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
    ax.set_ylabel(ylabel)
    if metric == "accuracy":
        ax.set_ylim(-2, 102)
        ax.axhline(100 * THRESHOLD, color="gray", lw=0.8, ls=":", label="90% accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=9, title=band_txt, title_fontsize=8)
    fig.tight_layout()
    try:
        plot_metrics.save_atomically(fig, out)  # a temp file renamed into place, with the umask's permissions
    except plot_metrics.PlotError as e:
        raise PlotError(str(e))
    finally:
        plt.close(fig)


def main(argv):
    p = argparse.ArgumentParser(prog="plot_sweep.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", required=True, help="the sweep directory, OUT/<name>")
    p.add_argument("--out", help="PNG to write (required unless --table-only)")
    p.add_argument("--metric", choices=("accuracy", "val_loss"), default="accuracy")
    p.add_argument("--x", choices=("step", "tokens"), default="step", dest="x_axis")
    p.add_argument("--band", choices=("minmax", "std"), default="minmax",
                   help="shaded band: min-max over seeds (default) or mean +- 1 std")
    p.add_argument("--table-only", action="store_true", help="print only the Markdown table")
    args = p.parse_args(argv)
    if not args.table_only and not args.out:
        raise PlotError("--out FILE.png is required (or --table-only)")
    name, groups = load(args.sweep, args.x_axis)
    tbl = table(groups)
    if args.table_only:
        print(tbl)
        return 0
    plot(name, groups, args.metric, args.x_axis, args.band, args.out)
    print("## %s\n" % name)
    print(tbl)
    print("\nwrote %s" % args.out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except PlotError as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        sys.exit(1)
