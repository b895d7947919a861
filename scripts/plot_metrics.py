#!/usr/bin/python3
"""Plot the metrics of one or more kvshift runs into one PNG.

    /usr/bin/python3 scripts/plot_metrics.py RUN_DIR [RUN_DIR ...] --out FILE.png
                                             [--title T] [--smooth K]

Each RUN_DIR is a directory written by `kvshift train --run-dir RUN_DIR`. Its
`metrics.jsonl` holds one JSON object per line, `{"type":"train",...}` every
`log_every` steps and `{"type":"eval",...}` at every evaluation; `config.json`
holds the run's config. Unparsable lines (a crashed run's last line) are skipped.

The figure has five panels, one line colour per run: training loss (moving
average of K points over the raw curve when --smooth K > 1), validation loss
(with blended data, `data.shards.weights`, also each source's, thin, one line
style per source, named in the panel),
accuracy in % (titled induction accuracy for the induction task, next-token
accuracy otherwise; for ngram and hopk runs the value is the task's accuracy on
its scored positions), learning rate, and gradient norm (log scale). The
legend names each run by its config `name` (fallback: the directory name) plus "(KV shift)" or
"(vanilla)". Panels without data say so. The PNG is written atomically (a
temporary file renamed into place) and its path printed.

Errors are one line, `plot_metrics: error: ...`, with exit code 1.
"""

import argparse
import json
import math
import os
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
from matplotlib import ticker  # noqa: E402
import numpy as np  # noqa: E402

PROG = "plot_metrics"
PANEL_TRAIN_KEYS = ("loss", "lr", "grad_norm")
PANEL_EVAL_KEYS = ("val_loss", "accuracy")
LINESTYLES = ["-", "--", ":", "-."]  # lr curves are often identical: keep every run visible


class PlotError(Exception):
    """A problem with the inputs or the output, reported as one line."""


# ----------------------------------------------------------------------------
# Reading runs


def read_config(run_dir):
    """Return the run's config.json as a dict, or {} if it is missing or unreadable."""
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        print("%s: warning: %s: cannot read config, naming the run by its directory" % (PROG, path),
              file=sys.stderr)
        return {}
    return config if isinstance(config, dict) else {}


def read_metrics(run_dir):
    """Return (train, eval) lists of records from RUN_DIR/metrics.jsonl, skipping bad lines."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise PlotError("%s: no metrics.jsonl (is this a `kvshift train --run-dir` directory?)" % path)
    train, evals = [], []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                record = parse_line(line)
                if record is None:
                    continue
                if record.get("type") == "train":
                    train.append(record)
                elif record.get("type") == "eval":
                    evals.append(record)
    except OSError as e:
        raise PlotError("%s: %s" % (path, e.strerror or e))
    return train, evals


def parse_line(line):
    """Return one metrics line as a dict with an integer step, or None if unusable."""
    line = line.strip()
    if not line:
        return None
    try:
        record = json.loads(line)  # accepts NaN/Infinity as well as null
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step"), (int, float)):
        return None
    return record


def run_label(run_dir, config):
    """Return the legend label: config name (or directory name) plus the attention kind."""
    name = config.get("name") or os.path.basename(os.path.normpath(run_dir)) or run_dir
    kv_shift = config.get("model", {}).get("kv_shift", {}) if isinstance(config.get("model"), dict) else {}
    enabled = kv_shift.get("enabled") if isinstance(kv_shift, dict) else None
    if enabled is True:
        return "%s (KV shift)" % name
    if enabled is False:
        return "%s (vanilla)" % name
    return str(name)


def data_type(config):
    """Return the run's data.type ('induction', 'ngram', 'hopk', 'shards') or None if unknown."""
    data = config.get("data")
    return data.get("type") if isinstance(data, dict) else None


def load_run(run_dir):
    """Read one run directory into a dict: label, data type, train and eval records."""
    if not os.path.isdir(run_dir):
        raise PlotError("%s: not a directory" % run_dir)
    train, evals = read_metrics(run_dir)
    config = read_config(run_dir)
    return {"dir": run_dir, "label": run_label(run_dir, config), "data_type": data_type(config),
            "train": train, "eval": evals}


def disambiguate_labels(runs):
    """Append the directory to labels that would otherwise appear twice in the legend."""
    labels = [r["label"] for r in runs]
    for run in runs:
        if labels.count(run["label"]) > 1:
            run["label"] = "%s [%s]" % (run["label"], os.path.normpath(run["dir"]))


# ----------------------------------------------------------------------------
# Series helpers


def series(records, key, positive=False):
    """Return (steps, values) arrays of the finite values of KEY (and > 0 if POSITIVE)."""
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if positive and value <= 0:
            continue
        steps.append(record["step"])
        values.append(float(value))
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def moving_average(values, k):
    """Trailing moving average over K points; the first K-1 points average what exists so far."""
    if k <= 1 or len(values) == 0:
        return values
    csum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - k, 0)
    return (csum[idx] - csum[lo]) / (idx - lo)


# What each data type's accuracy measures, as `kvshift eval` names it.
ACCURACY_NAMES = {"induction": "induction", "ngram": "3-gram", "hopk": "hop-k", "shards": "next-token"}


def accuracy_labels(runs):
    """Return the accuracy panel's (title, y label) from the runs' data types."""
    kinds = sorted({ACCURACY_NAMES.get(r["data_type"], "next-token") for r in runs if r["data_type"] is not None})
    if len(kinds) == 1:
        return "%s accuracy" % kinds[0], "%s accuracy (%%)" % kinds[0]
    if kinds:
        return "accuracy (%s)" % " / ".join(kinds), "accuracy (%)"
    return "accuracy", "accuracy (%)"


def distinct_colors(n):
    """n colours no two alike: tab10 up to 10 lines, tab20 up to 20, then evenly along turbo."""
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [plt.get_cmap("turbo")(i / (n - 1)) for i in range(n)]


# ----------------------------------------------------------------------------
# Panels


def note_empty(ax, text):
    """Write a centred grey note in a panel that has nothing to plot."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center",
            color="0.45", fontsize=10, wrap=True)
    ax.set_yticks([])


def style_panel(ax, title, ylabel):
    """Common look of a panel: title, axis labels, light grid."""
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3, linewidth=0.6)
    ax.ticklabel_format(axis="x", style="plain", useOffset=False)


def plot_train_loss(ax, runs, colors, smooth):
    """Training loss per run; with SMOOTH > 1 the moving average over the raw curve, drawn faint."""
    drawn = False
    for run, color in zip(runs, colors):
        steps, loss = series(run["train"], "loss")
        if len(steps) == 0:
            continue
        drawn = True
        if smooth > 1:
            ax.plot(steps, loss, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(steps, moving_average(loss, smooth), color=color, linewidth=1.6)
        else:
            ax.plot(steps, loss, color=color, linewidth=1.4)
    title = "training loss" + (" (moving average of %d)" % smooth if smooth > 1 else "")
    style_panel(ax, title, "loss")
    if not drawn:
        note_empty(ax, "no train lines in metrics.jsonl")


def plot_eval_metric(ax, runs, colors, key, title, ylabel, scale=1.0):
    """An eval metric per run (markers at each evaluation); notes runs without eval lines."""
    missing = []
    for run, color in zip(runs, colors):
        steps, values = series(run["eval"], key)
        if len(steps) == 0:
            missing.append(run["label"])
            continue
        ax.plot(steps, values * scale, color=color, linewidth=1.6, marker="o", markersize=3.5)
    style_panel(ax, title, ylabel)
    if len(missing) == len(runs):
        note_empty(ax, "no eval data\n(no eval lines or all values NaN)")
    elif missing:
        ax.text(0.02, 0.02, "no eval data: " + ", ".join(missing), transform=ax.transAxes,
                ha="left", va="bottom", color="0.45", fontsize=7)


def source_names(run):
    """The blended sources the run's eval lines report (first seen first)."""
    names = []
    for record in run["eval"]:
        sources = record.get("sources")
        if isinstance(sources, dict):
            names.extend(n for n in sources if n not in names)
    return names


def plot_source_losses(ax, runs, colors):
    """Each blended source's validation loss: thin lines in the run's colour, a line style per source."""
    styles = {}
    for run, color in zip(runs, colors):
        for name in source_names(run):
            style = styles.setdefault(name, LINESTYLES[(len(styles) + 1) % len(LINESTYLES)])
            records = [dict(r["sources"][name], step=r["step"]) for r in run["eval"]
                       if isinstance(r.get("sources"), dict) and isinstance(r["sources"].get(name), dict)]
            steps, values = series(records, "val_loss")
            if len(steps):
                ax.plot(steps, values, color=color, linewidth=0.9, linestyle=style, alpha=0.8,
                        label="_source " + name)
    if styles:
        handles = [plt.Line2D([0], [0], color="0.3", linewidth=1.6)] + \
            [plt.Line2D([0], [0], color="0.3", linewidth=0.9, linestyle=st) for st in styles.values()]
        ax.legend(handles, ["all sources"] + list(styles), loc="upper right", fontsize=7, frameon=False)


def plot_train_metric(ax, runs, colors, key, title, ylabel, log=False, vary_style=False):
    """A per-step training metric per run, optionally on a log y axis or with a line style per run."""
    drawn = False
    for i, (run, color) in enumerate(zip(runs, colors)):
        steps, values = series(run["train"], key, positive=log)
        if len(steps) == 0:
            continue
        drawn = True
        style = LINESTYLES[i % len(LINESTYLES)] if vary_style else "-"
        ax.plot(steps, values, color=color, linewidth=1.4, linestyle=style)
    style_panel(ax, title, ylabel)
    if log and drawn:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain_log_formatter())
        ax.yaxis.set_minor_formatter(plain_log_formatter())
    if not drawn:
        note_empty(ax, "no %s in train lines" % key)


def plain_log_formatter():
    """Log-axis tick labels as plain numbers (0.6, 2, 30), on the ticks matplotlib would label."""
    choose = ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5))

    def label(x, pos=None):
        return "%g" % x if choose(x, pos) else ""

    def set_locs(locs):
        choose.set_axis(formatter.axis)
        choose.set_locs(locs)

    formatter = ticker.FuncFormatter(label)
    formatter.set_locs = set_locs
    return formatter


def share_step_range(axes, runs):
    """Give every metric panel the same step axis, from 0 to the last logged step."""
    last = 0.0
    for run in runs:
        for records, keys in ((run["train"], PANEL_TRAIN_KEYS), (run["eval"], PANEL_EVAL_KEYS)):
            for key in keys:
                steps, _ = series(records, key)
                last = max(last, steps.max(initial=0.0))
    if last > 0:
        for ax in axes:
            ax.set_xlim(0, last * 1.02)


def draw_legend(ax, runs, colors):
    """Use a spare panel as the legend: one entry per run."""
    ax.axis("off")
    handles = [plt.Line2D([0], [0], color=c, linewidth=2.5) for c in colors]
    ax.legend(handles, [r["label"] for r in runs], loc="center", frameon=False,
              fontsize=10, title="runs", title_fontsize=11)


def build_figure(runs, title, smooth):
    """Return the whole figure: five metric panels and a legend panel."""
    colors = distinct_colors(len(runs))
    fig, axes = plt.subplots(2, 3, figsize=(16, 9), constrained_layout=True)
    ax = axes.ravel()
    plot_train_loss(ax[0], runs, colors, smooth)
    plot_eval_metric(ax[1], runs, colors, "val_loss", "validation loss", "loss")
    plot_source_losses(ax[1], runs, colors)
    acc_title, acc_axis = accuracy_labels(runs)
    plot_eval_metric(ax[2], runs, colors, "accuracy", acc_title, acc_axis, scale=100.0)
    plot_train_metric(ax[3], runs, colors, "lr", "learning rate", "lr", vary_style=True)
    plot_train_metric(ax[4], runs, colors, "grad_norm", "gradient norm (log scale)", "grad norm", log=True)
    ax[3].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    if ax[2].has_data():
        ax[2].set_ylim(-3, 103)
    share_step_range(ax[:5], runs)
    draw_legend(ax[5], runs, colors)
    fig.suptitle(title, fontsize=14)
    return fig


# ----------------------------------------------------------------------------
# Output


def current_umask():
    """Return the process umask (reading it requires setting it, so set it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_atomically(fig, out):
    """Write FIG as PNG to a temporary file next to OUT, then rename it into place."""
    out_dir = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(out_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(out), suffix=".tmp", dir=out_dir)
    except OSError as e:
        raise PlotError("%s: cannot write: %s" % (out, e.strerror or e))
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; give the PNG normal permissions
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=110)
        os.replace(tmp, out)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise PlotError("%s: cannot write: %s" % (out, e.strerror or e))
        raise


def parse_args(argv):
    """Parse the command line."""
    parser = argparse.ArgumentParser(prog=PROG, description="Plot kvshift run metrics into one PNG.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directory with metrics.jsonl")
    parser.add_argument("--out", required=True, metavar="FILE.png", help="output PNG path")
    parser.add_argument("--title", default="kvshift training metrics", help="figure title")
    parser.add_argument("--smooth", type=int, default=1, metavar="K",
                        help="moving average of K points over the training loss (default 1: none)")
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error("--smooth must be >= 1")
    return args


def main(argv=None):
    """Load the runs, draw the figure, write it and print its path."""
    args = parse_args(argv)
    try:
        runs = [load_run(d) for d in args.run_dirs]
        if not any(r["train"] or r["eval"] for r in runs):
            raise PlotError("no usable metrics lines in %s" % ", ".join(args.run_dirs))
        disambiguate_labels(runs)
        fig = build_figure(runs, args.title, args.smooth)
        save_atomically(fig, args.out)
        plt.close(fig)
    except PlotError as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
