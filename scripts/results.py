#!/usr/bin/python3
"""Write docs/RESULTS.md from the sweeps under runs/experiments (scripts/sweep.py).

    /usr/bin/python3 scripts/results.py --experiments runs/experiments --out docs/RESULTS.md

For every sweep directory present (one with a sweep.json; in the order fig1a,
fig1a-long, fig1b, fig3, fig8, hopk, lm-text, then the others alphabetically)
it writes a section with the setup (spec name, description, base config, grid,
seeds, steps), the plot of accuracy, or of validation loss for fig8 and
lm-text (docs/results/<name>.png, drawn by scripts/plot_sweep.py; fig1b and
hopk get a second plot), the results table (mean +- std over seeds, steps to
90%; final validation losses for fig8 and lm-text), the learned shift
coefficients of the finished KV shifting cells (`kvshift inspect`, the
paper's Table 4) and, for the sweeps that reproduce a paper claim (fig1a,
fig1a-long, fig1b, fig3, fig8, hopk, lm-text), one sentence per paper claim
saying whether the runs support it, computed from the numbers. Errors are one line,
`results: error: ...`, exit code 1.
"""

import argparse
import datetime
import json
import math
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_sweep  # noqa: E402

PROG = "results"
ORDER = ["fig1a", "fig1a-long", "fig1b", "fig3", "fig8", "hopk", "lm-text"]
LOSS_SWEEPS = ("fig8", "lm-text")  # judged on validation loss; the others on accuracy
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ResultsError(Exception):
    pass


def git_head(path):
    try:
        out = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def git_dirty(path, ignore=()):
    """Uncommitted changes to tracked files, not counting this page and its plots (`ignore`)."""
    try:
        out = subprocess.run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no", "--", "."]
                             + [":(exclude)%s" % os.path.relpath(p, path) for p in ignore],
                             capture_output=True, text=True, check=True)
        return bool(out.stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return None


# ----------------------------------------------------------------------------
# Per-label numbers


class LabelStats:
    def __init__(self, label, seeds, max_steps):
        self.label = label
        # A seed whose last evaluation has no accuracy (null: NaN, a diverged run) is a seed without data,
        # so that acc is a number whenever n > 0.
        with_data = [s for s in seeds if s["final"] and isinstance(s["evals"][-1].get("accuracy"), (int, float))]
        self.n = len(with_data)
        self.n_seeds = len(seeds)
        self.finished = sum(s["finished"] for s in seeds)
        accs = [s["evals"][-1].get("accuracy") for s in with_data]
        self.acc, self.acc_std = plot_sweep.mean_std(accs)
        self.reach = [plot_sweep.steps_to(s["evals"]) for s in with_data]
        self.all_reached = self.n > 0 and all(r is not None for r in self.reach)
        # Mean steps to 90% with a seed that never got there counted as infinite.
        self.speed = float(np.mean(self.reach)) if self.all_reached else math.inf
        self.max_steps = max_steps

    def acc_txt(self):
        if self.acc is None:
            return "no data"
        return "%.1f%% ± %.1f" % (100 * self.acc, 100 * self.acc_std)

    def speed_txt(self):
        if self.n == 0:
            return "no data"
        if self.all_reached:
            return "%.0f steps to 90%%" % self.speed
        got = sum(r is not None for r in self.reach)
        return "90%% not reached by %d of %d seeds" % (self.n - got, self.n)


def verdict(ok):
    return "**supported**" if ok else "**not supported**"


def fig1a_claims(stats):
    need = ["vanilla-1l", "vanilla-2l", "vanilla-4l", "kvshift-1l"]
    missing = [k for k in need if k not in stats or stats[k].n == 0]
    if missing:
        return ["Claims not evaluated: no data for %s." % ", ".join(missing)]
    kv1, v1, v2, v4 = (stats[k] for k in ("kvshift-1l", "vanilla-1l", "vanilla-2l", "vanilla-4l"))
    out = []
    others = [s for k, s in stats.items() if k != "kvshift-1l" and s.n > 0]
    fastest = kv1.all_reached and all(kv1.speed <= s.speed for s in others)
    ties = [s.label for s in others if s.speed == kv1.speed]
    ok = kv1.acc >= 0.95 and fastest
    out.append(
        "*1-layer KV shifting learns induction fully (≥ 95%%) and fastest*: %s — kvshift-1l ends at %s, %s%s; "
        "the others: %s." % (
            verdict(ok), kv1.acc_txt(), kv1.speed_txt(),
            " (tied with %s)" % ", ".join(ties) if ties else "",
            "; ".join("%s %s" % (s.label, s.speed_txt()) for s in others)))
    out.append("*1-layer vanilla fails to learn induction (< 50%%)*: %s — vanilla-1l ends at %s." % (
        verdict(v1.acc < 0.5), v1.acc_txt()))
    learns = v2.acc >= 0.9
    slower = v2.speed > kv1.speed
    out.append(
        "*2-layer vanilla learns induction (≥ 90%%) but more slowly than 1-layer KV shifting*: %s — vanilla-2l ends "
        "at %s, %s, vs kvshift-1l %s%s." % (verdict(learns and slower), v2.acc_txt(), v2.speed_txt(), kv1.speed_txt(),
                                              "" if learns else " (within the %s steps run)" % v2.max_steps))
    out.append("*4-layer vanilla is no faster than 2-layer vanilla*: %s." % four_vs_two_layers(v4, v2))
    return out


def four_vs_two_layers(v4, v2):
    """The verdict on "4-layer vanilla is no faster than 2-layer" and the numbers behind it."""
    seeds = lambda s: ", ".join("—" if r is None else str(r) for r in s.reach)
    numbers = "vanilla-4l %s, %s (per seed: %s); vanilla-2l %s, %s (per seed: %s)" % (
        v4.acc_txt(), v4.speed_txt(), seeds(v4), v2.acc_txt(), v2.speed_txt(), seeds(v2))
    if math.isinf(v4.speed) and math.isinf(v2.speed):
        return "**inconclusive** — neither reached 90%% in every seed within %s steps: %s" % (v2.max_steps, numbers)
    return "%s — %s" % (verdict(v4.speed >= v2.speed), numbers)


def fig1b_sizes(stats, configs):
    """{hidden: {"vanilla-2l": LabelStats, "kvshift-1l": LabelStats}} from labels '<kind>-h<hidden>'."""
    sizes = {}
    for label, s in stats.items():
        kind, _, h = label.rpartition("-h")
        hidden = configs.get(label, {}).get("hidden_size")
        if hidden is None and h.isdigit():
            hidden = int(h)
        if hidden is None:
            continue
        sizes.setdefault(hidden, {})[kind] = s
    return dict(sorted(sizes.items()))


def fig1b_claims(sizes):
    rows, fails = [], []
    for h, kinds in sizes.items():
        kv, va = kinds.get("kvshift-1l"), kinds.get("vanilla-2l")
        if kv is None or va is None or kv.n == 0 or va.n == 0:
            rows.append("hidden %d: not evaluated (missing data)" % h)
            continue
        ok = kv.acc >= va.acc
        if not ok:
            fails.append(h)
        rows.append("hidden %d: kvshift-1l %s vs vanilla-2l %s (%s)" % (
            h, kv.acc_txt(), va.acc_txt(), "holds" if ok else "does not hold"))
    evaluated = [r for r in rows if "not evaluated" not in r]
    if not evaluated:
        return ["Claim not evaluated: no (kvshift-1l, vanilla-2l) pair with data."]
    if fails:
        head = "*At each hidden size, 1-layer KV shifting reaches at least 2-layer vanilla's final accuracy*: " \
               "**not supported** at hidden %s." % ", ".join(str(h) for h in fails)
    else:
        head = "*At each hidden size, 1-layer KV shifting reaches at least 2-layer vanilla's final accuracy*: " \
               "**supported** at every hidden size run (%s)." % ", ".join(str(h) for h in sizes)
    return [head] + ["- " + r for r in rows]


def plot_fig1b(sizes, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for kind, color in (("vanilla-2l", "tab:blue"), ("kvshift-1l", "tab:orange")):
        xs, ys, es = [], [], []
        for h, kinds in sizes.items():
            s = kinds.get(kind)
            if s is not None and s.acc is not None:
                xs.append(h)
                ys.append(100 * s.acc)
                es.append(100 * s.acc_std)
        if xs:
            n = max(kinds[kind].n for kinds in sizes.values() if kind in kinds)
            ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, color=color, label="%s (n=%d)" % (kind, n))
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(sizes))
    ax.set_xticklabels([str(h) for h in sizes])
    ax.set_xlabel("hidden size")
    ax.set_ylabel("final induction accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.set_title("fig1b: final accuracy vs hidden size (mean ± 1 std over seeds)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)


# ----------------------------------------------------------------------------
# Comparisons under seed noise


def final_by_seed(seeds, key):
    """seed -> the final eval's `key`, for the seeds that have one (plot_sweep.load's "final")."""
    return {s["seed"]: s["evals"][-1][key] for s in seeds if s["final"] and s["evals"][-1].get(key) is not None}


def not_final_reason(s):
    """Why a seed gives no final numbers (plot_sweep.load's "final" is false)."""
    if not s["evals"]:
        return "no metrics.jsonl or no evaluation in it"
    last = "last evaluation at step %d of %s" % (s["evals"][-1]["step"], s["steps"] if s["steps"] else "?")
    return last if s["finished"] else "not finished, " + last


def final_values(seeds, key):
    return list(final_by_seed(seeds, key).values())


def spread(values):
    return (max(values) - min(values)) if len(values) > 1 else 0.0


def compare(a_vals, b_vals):
    """(mean a - mean b, noise) with noise = the larger seed spread (max - min) of the two."""
    return float(np.mean(a_vals)) - float(np.mean(b_vals)), max(spread(a_vals), spread(b_vals))


def split_label(label):
    """'vanilla-2l-h32' -> ('vanilla', '2l-h32'); 'kvshift' -> ('kvshift', '')."""
    kind, _, rest = label.partition("-")
    return kind, rest


def fig3_claims(groups):
    sizes = {}
    for label, seeds in groups.items():
        kind, size = split_label(label)
        sizes.setdefault(size, {})[kind] = final_values(seeds, "accuracy")
    rows, verdicts = [], []
    for size, kinds in sizes.items():
        kv, va = kinds.get("kvshift"), kinds.get("vanilla")
        if not kv or not va:
            rows.append("%s: not evaluated (missing data)" % size)
            continue
        d, noise = compare(kv, va)
        tol = max(noise, 0.02)
        if abs(d) <= tol:
            word = "neither helps nor hurts"
        elif d > 0:
            word = "KV shifting helps"
        else:
            word = "KV shifting hurts"
        verdicts.append(word == "neither helps nor hurts")
        rows.append("%s: kvshift %.1f%% vs vanilla %.1f%%, difference %+.1f points, seed spread %.1f points: %s" % (
            size, 100 * np.mean(kv), 100 * np.mean(va), 100 * d, 100 * noise, word))
    if not verdicts:
        return ["Claim not evaluated: no (kvshift, vanilla) pair with data."]
    if all(verdicts):
        head = verdict(True) + " at every size"
    elif any(verdicts):
        head = "**partly supported** (%d of %d sizes)" % (sum(verdicts), len(verdicts))
    else:
        head = verdict(False)
    return ["*KV shifting neither helps nor hurts 3-gram memorisation* (a difference counts when it exceeds both "
            "2 points and the larger seed spread): %s." % head] + ["- " + r for r in rows]


def loss_table(groups, ref="kvshift", base="vanilla"):
    rows = ["| label | seeds | final val_loss (mean ± std) | per seed | vs %s | vs %s |" % (base, ref),
            "|---|---|---|---|---|---|"]
    vals = {label: final_values(seeds, "val_loss") for label, seeds in groups.items()}
    for label, v in vals.items():
        if not v:
            rows.append("| %s | 0 | %s | | | |" % (label, plot_sweep.DASH))
            continue
        m, sd = plot_sweep.mean_std(v)
        rel_txt = []
        for other in (base, ref):
            if vals.get(other) and other != label:
                rel_txt.append("%+.4f" % (m - float(np.mean(vals[other]))))
            else:
                rel_txt.append(plot_sweep.DASH)
        rows.append("| %s | %d | %.4f ± %.4f | %s | %s | %s |" % (
            label, len(v), m, sd, ", ".join("%.4f" % x for x in v), rel_txt[0], rel_txt[1]))
    return "\n".join(rows), vals


def fig8_claims(vals):
    def cmp(a, b):
        if not vals.get(a) or not vals.get(b):
            return None
        return compare(vals[a], vals[b])

    out, judged = [], []

    def claim(text, a, b, want):
        """want 'lower': a's loss below b's beyond the noise; 'not lower': a not below b beyond the noise;
        'higher': a above b beyond the noise."""
        c = cmp(a, b)
        if c is None:
            out.append("*%s*: not evaluated (no data for %s or %s)." % (text, a, b))
            return
        d, noise = c
        within = abs(d) <= noise
        if want == "lower":
            word = verdict(True) if d < -noise else ("**inconclusive** (within seed spread)" if within else verdict(False))
        elif want == "higher":
            word = verdict(True) if d > noise else ("**inconclusive** (within seed spread)" if within else verdict(False))
        else:  # not lower
            word = ("**consistent** (no difference beyond the seed spread)" if within
                    else verdict(True) if d > 0 else verdict(False))
        judged.append(within)
        out.append("*%s*: %s — %s %.4f vs %s %.4f (difference %+.4f, seed spread %.4f)." % (
            text, word, a, float(np.mean(vals[a])), b, float(np.mean(vals[b])), d, noise))

    claim("KV shifting reaches a lower validation loss than vanilla", "kvshift", "vanilla", "lower")
    claim("the sigmoid gate does not learn better than free coefficients (4.6)", "gate", "kvshift", "not lower")
    claim("clamping to [0, 1] does not learn better than free coefficients (4.6)", "clamp01", "kvshift", "not lower")
    claim("shifting K only is worse than shifting K and V (4.7)", "k-only", "kvshift", "higher")
    claim("shifting V only is worse than shifting K and V (4.7)", "v-only", "kvshift", "higher")
    claim("a window of 2 does not improve on window 1 (4.7)", "window2", "kvshift", "not lower")
    claim("a window of 3 does not improve on window 1 (4.7)", "window3", "kvshift", "not lower")
    claim("QKV shifting is not better than KV shifting (appendix J)", "qkv", "kvshift", "not lower")
    if judged and sum(judged) * 2 > len(judged):
        out.append("Most differences here are within the seed spread: at this size and length the seeds differ by "
                   "up to %.3f nats, more than most variants differ from each other; more seeds or longer runs are "
                   "needed to rank the variants." % max(spread(v) for v in vals.values() if v))
    return out


def lm_text_claims(groups):
    """The paper's language-modelling claim on real text: kvshift vs vanilla final validation loss."""
    kv_seeds, va_seeds = (final_by_seed(groups.get(label, []), "val_loss") for label in ("kvshift", "vanilla"))
    kv, va = list(kv_seeds.values()), list(va_seeds.values())
    if not kv or not va:
        return ["*KV shifting reaches a lower validation loss than vanilla*: not evaluated (missing data)."]
    d, noise = compare(kv, va)
    # Seed k of each model: same data order, same init draws. Only seeds both models have are paired.
    pairs = [(seed, kv_seeds[seed] - va_seeds[seed]) for seed in sorted(kv_seeds) if seed in va_seeds]
    if d < -noise:
        word = verdict(True)
    elif abs(d) <= noise:
        word = "**inconclusive** (the gap is within the seed spread)"
    else:
        word = verdict(False) + " (vanilla is lower)"
    (mk, sk), (mv, sv) = plot_sweep.mean_std(kv), plot_sweep.mean_std(va)
    return [
        "*KV shifting reaches a lower validation loss than vanilla at the same compute*: %s — kvshift %.4f ± %.4f "
        "vs vanilla %.4f ± %.4f (mean ± std over %d and %d seeds), gap %+.4f nats, larger seed spread (max − min) "
        "%.4f." % (word, mk, sk, mv, sv, len(kv), len(va), d, noise),
        "Per seed (kvshift − vanilla, same seed): %s; KV shifting is lower in %d of %d seeds." % (
            ", ".join("seed %d %+.4f" % p for p in pairs), sum(x < 0 for _, x in pairs), len(pairs))
        if pairs else "Per seed: no seed has a final validation loss for both models.",
        "For scale: outside reproductions report about −0.01 to −0.02 validation loss for KV shifting at GPT-2-small "
        "scale (124M parameters, billions of tokens); this run is 12.6M parameters and 0.8M tokens.",
    ]


def hopk_points(groups):
    """{kind: {k: [final error per seed]}} from labels '<kind>-<layers>-k<k>'."""
    pts = {}
    for label, seeds in groups.items():
        kind, rest = split_label(label)
        _, _, k = rest.rpartition("-k")
        if not k.isdigit():
            continue
        pts.setdefault(kind, {})[int(k)] = [1.0 - a for a in final_values(seeds, "accuracy")]
    return {kind: dict(sorted(d.items())) for kind, d in pts.items()}


def plot_hopk(pts, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for kind, color in (("vanilla", "tab:blue"), ("kvshift", "tab:orange")):
        d = pts.get(kind, {})
        xs = [k for k, v in d.items() if v]
        if not xs:
            continue
        ys = [100 * float(np.mean(d[k])) for k in xs]
        es = [100 * (float(np.std(d[k], ddof=1)) if len(d[k]) > 1 else 0.0) for k in xs]
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, color=color, label="%s (n=%d)" % (kind, len(d[xs[0]])))
    ax.set_xlabel("k (hops)")
    ax.set_ylabel("final error rate (%)")
    ax.set_ylim(bottom=0)
    ax.set_title("hop-k: error vs k (mean ± 1 std over seeds)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)


def hopk_claims(pts):
    kv, va = pts.get("kvshift", {}), pts.get("vanilla", {})
    ks = [k for k in kv if kv[k] and va.get(k)]
    if not ks:
        return ["Claims not evaluated: no (kvshift, vanilla) pair with data."]
    rows, lower, ties = [], [], []
    for k in ks:
        d, noise = compare(kv[k], va[k])
        (lower if d < -noise else ties).append(k)
        rows.append("k = %d: error kvshift %.1f%% vs vanilla %.1f%% (difference %+.1f points, seed spread %.1f)" % (
            k, 100 * np.mean(kv[k]), 100 * np.mean(va[k]), 100 * d, 100 * noise))
    higher = [k for k in ties if np.mean(kv[k]) > np.mean(va[k]) + spread(kv[k]) + spread(va[k])]
    if not higher and not ties:
        word = verdict(True) + " at every k"
    elif lower and not higher:
        word = ("**supported where the difference exceeds the seed spread** (k = %s); within the spread at k = %s "
                "(both models solve it, or both are near chance)" % (
                    ", ".join(map(str, lower)), ", ".join(map(str, ties))))
    else:
        word = verdict(False)
    out = ["*KV shifting has a lower hop-k error than vanilla*: %s." % word]
    gaps = [float(np.mean(va[k]) - np.mean(kv[k])) for k in ks]
    if len(ks) >= 2:
        top = int(np.argmax(gaps))
        if top == len(ks) - 1:
            g = verdict(True)
        elif top > 0:
            g = ("**partly supported**: the gap grows up to k = %d and shrinks after it, where both models approach "
                 "the error of guessing within the steps run" % ks[top])
        else:
            g = verdict(False)
        out.append("*The gap grows with k*: %s — vanilla minus kvshift error: %s." % (
            g, ", ".join("%+.1f points at k = %d" % (100 * x, k) for x, k in zip(gaps, ks))))
    return out + ["- " + r for r in rows]


def fig1a_long_claim(stats):
    v4 = stats.get("vanilla-4l")
    v2 = stats.get("vanilla-2l")
    if not v4 or not v2 or not v4.n or not v2.n:
        return []
    return ["Paper claim (section 3.2, Figure 1a) with the longer budget: *4-layer vanilla is no faster than 2-layer "
            "vanilla*: %s." % four_vs_two_layers(v4, v2), ""]


# ----------------------------------------------------------------------------
# Learned shift coefficients (kvshift inspect), the paper's Table 4


def inspect_section(sweep_dir, cells, kvshift):
    """Markdown lines: Table 4 counts summed over the finished KV shifting cells, per label; a line
    saying why when they could not be read (no binary, a cell whose inspect failed)."""
    if not kvshift or not os.access(kvshift, os.X_OK):
        return ["(Learned shift coefficients not read: `%s` is not an executable kvshift; pass --kvshift.)"
                % (kvshift or "?"), ""]
    per_label, failed = {}, []
    for c in cells:
        if c.get("status") != "finished":
            continue
        run_dir = os.path.join(sweep_dir, c["label"], "seed%d" % c["seed"])
        try:
            out = subprocess.run([kvshift, "inspect", "--json", "--checkpoint", run_dir],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise ValueError((out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1])
            j = json.loads(out.stdout)
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            failed.append("`%s` seed %d: %s" % (c["label"], c["seed"], str(e)[:200]))
            continue
        if not j.get("kv_shift") or not j.get("table4"):
            continue
        t = j["table4"]
        d = per_label.setdefault(c["label"], {"n": [0, 0, 0, 0], "a": [], "b": [], "seeds": 0})
        d["seeds"] += 1
        d["n"][0] += t["a_cur_gt_a_prev"]["b_cur_gt_b_prev"]
        d["n"][1] += t["a_cur_gt_a_prev"]["b_cur_le_b_prev"]
        d["n"][2] += t["a_cur_le_a_prev"]["b_cur_gt_b_prev"]
        d["n"][3] += t["a_cur_le_a_prev"]["b_cur_le_b_prev"]
        for key, dst in (("k_shift", d["a"]), ("v_shift", d["b"])):
            for layer in j[key]:
                dst += [sum(h) for h in layer]
    note = ["(`kvshift inspect` failed, so these cells are left out of the coefficients: %s.)"
            % "; ".join(failed), ""] if failed else []
    if not per_label:
        return note
    L = note + ["Learned shift coefficients (`kvshift inspect`, the paper's Table 4 and section 4.6), summed over the "
         "finished seeds' final checkpoints; a = k_shift, b = v_shift, cur = weight of position t, prev = of t-1:", "",
         "| label | seeds | (layer, KV head) pairs | a_cur > a_prev, b_cur > b_prev | a_cur > a_prev, b_cur ≤ b_prev "
         "| a_cur ≤ a_prev, b_cur > b_prev | a_cur ≤ a_prev, b_cur ≤ b_prev | a_cur + a_prev min / mean / max "
         "| b_cur + b_prev min / mean / max |",
         "|---|---|---|---|---|---|---|---|---|"]
    for label, d in per_label.items():
        n = d["n"]
        L.append("| %s | %d | %d | %d | %d | %d | %d | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f |" % (
            label, d["seeds"], sum(n), n[0], n[1], n[2], n[3],
            min(d["a"]), float(np.mean(d["a"])), max(d["a"]), min(d["b"]), float(np.mean(d["b"])), max(d["b"])))
    tot = [sum(d["n"][i] for d in per_label.values()) for i in range(4)]
    diag = tot[0] + tot[3]
    L += ["", "The paper (2.9B model) finds the diagonal (same order for a and b) dominates; here the diagonal holds "
          "%d of %d pairs (%s). These are small models after a few hundred steps, not the paper's "
          "pretrained 2.9B language model, so this is an observation, not a test of that claim." % (
              diag, sum(tot), "it dominates" if 2 * diag > sum(tot) else "it does not dominate"),
          ""]
    return L


# ----------------------------------------------------------------------------
# Sections


def read_sections(page):
    """[(name, text)] of an existing RESULTS.md: every '## name' section, header excluded."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    out = []
    for chunk in text.split("\n## ")[1:]:
        name = chunk.split("\n", 1)[0].strip()
        out.append((name, "## " + chunk.rstrip("\n") + "\n"))
    return out


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def rel(path, start):
    try:
        return os.path.relpath(path, start)
    except ValueError:
        return path


def section(sweep_dir, png_dir, out_dir, kvshift):
    meta = read_json(os.path.join(sweep_dir, "sweep.json")) or {}
    name, groups = plot_sweep.load(sweep_dir, "step")
    spec = read_json(meta.get("spec", "")) if meta.get("spec") else None
    cells = meta.get("cells", [])
    steps = sorted({c.get("steps") for c in cells if c.get("steps") is not None})
    configs = {}
    for label in groups:
        for c in cells:
            if c.get("label") == label:
                cfg = read_json(os.path.join(sweep_dir, label, "seed%d" % c["seed"], "config.json"))
                if cfg:
                    configs[label] = cfg.get("model", {})
                    break
    max_steps = steps[-1] if steps else None
    stats = {label: LabelStats(label, seeds, max_steps) for label, seeds in groups.items()}
    status = {}
    for c in cells:
        status[c.get("status")] = status.get(c.get("status"), 0) + 1

    L = ["## %s" % name, ""]
    if meta.get("description"):
        L += [meta["description"], ""]
    L.append("- spec: `%s`; base config: `%s`" % (rel(meta.get("spec", "?"), ROOT), rel(meta.get("base", "?"), ROOT)))
    if spec and spec.get("set"):
        L.append("- every cell: %s" % ", ".join("`%s=%s`" % (k, json.dumps(v)) for k, v in spec["set"].items()))
    if spec and spec.get("grid"):
        L.append("- grid:")
        for g in spec["grid"]:
            L.append("  - `%s`: %s" % (g["label"], ", ".join("`%s=%s`" % (k, json.dumps(v))
                                                            for k, v in g.get("set", {}).items()) or "base"))
    L.append("- seeds: %s; steps: %s; cells: %s" % (
        meta.get("seeds"), ", ".join(map(str, steps)) or "?",
        ", ".join("%d %s" % (n, s) for s, n in sorted(status.items(), key=lambda x: str(x[0])))))
    if meta.get("updated"):
        L.append("- runs last updated %s with `%s`" % (meta["updated"], rel(meta.get("kvshift") or "?", ROOT)))
    unfinished = [c for c in cells if c.get("status") != "finished"]
    if unfinished:
        labels = sorted({c["label"] for c in unfinished}, key=lambda l: list(groups).index(l) if l in groups else 0)
        L.append("- **incomplete**: %d of %d cells not finished (labels: %s); final numbers below are over the "
                 "seeds with an evaluation at their last step." % (len(unfinished), len(cells), ", ".join(labels)))
    left_out = ["`%s` seed %d (%s)" % (label, s["seed"], not_final_reason(s))
                for label, seeds in groups.items() for s in seeds if not s["final"]]
    if left_out:
        L.append("- **not in the final numbers**: %s." % "; ".join(left_out))
    L.append("")

    try:
        os.makedirs(png_dir, exist_ok=True)
    except OSError as e:
        raise ResultsError("%s: cannot create the plots' directory: %s" % (png_dir, e.strerror or e))
    png = os.path.join(png_dir, "%s.png" % name)
    metric = "val_loss" if name in LOSS_SWEEPS else "accuracy"
    try:
        plot_sweep.plot(name, groups, metric, "step", "minmax", png)
        L += ["![%s: %s vs step](%s)" % (name, metric.replace("_", " "), rel(png, out_dir)), ""]
    except plot_sweep.PlotError as e:
        L += ["(no plot: %s)" % e, ""]
    sizes = None
    if name == "fig1b":
        sizes = fig1b_sizes(stats, configs)
        if sizes:
            png2 = os.path.join(png_dir, "%s-hidden.png" % name)
            plot_fig1b(sizes, png2)
            L += ["![%s: final accuracy vs hidden size](%s)" % (name, rel(png2, out_dir)), ""]
    if name == "hopk":
        pts = hopk_points(groups)
        if pts:
            png2 = os.path.join(png_dir, "%s-error.png" % name)
            plot_hopk(pts, png2)
            L += ["![%s: final error rate vs k](%s)" % (name, rel(png2, out_dir)), ""]
    if name in LOSS_SWEEPS:
        tab, vals = loss_table(groups)
        L += [tab, ""]
    else:
        L += [plot_sweep.table(groups), ""]
    L += inspect_section(sweep_dir, cells, kvshift)
    if name == "fig1a":
        L += ["Paper claims (section 3.2, Figure 1a), checked against the table:", ""]
        L += ["- " + c for c in fig1a_claims(stats)] + [""]
    elif name == "fig1b":
        L += ["Paper claim (section 3.2, Figure 1b), checked against the table:", ""]
        L += fig1b_claims(sizes) + [""]
    elif name == "fig1a-long":
        L += fig1a_long_claim(stats)
    elif name == "fig3":
        L += ["Paper claim (section 3.3, Figure 3), checked against the table:", ""]
        L += fig3_claims(groups) + [""]
    elif name == "fig8":
        L += ["Paper claims (sections 4.6 and 4.7, Figure 8; appendix J), checked against the final validation "
              "losses (a difference counts only when it exceeds the larger seed spread, max − min):", ""]
        L += ["- " + c for c in fig8_claims(vals)] + [""]
    elif name == "hopk":
        L += ["Paper claim (appendix H, Figure 9), checked against the final error rates:", ""]
        L += hopk_claims(hopk_points(groups)) + [""]
    elif name == "lm-text":
        L += ["Paper claim (section 4, Figure 4 and Table 1: KV shifting ahead in language modelling), checked "
              "against the final validation losses:", ""]
        L += ["- " + c for c in lm_text_claims(groups)] + [""]
    return name, "\n".join(L), stats


def with_cross_sweep_claim(sections, kept):
    """The sections, fig1a-long's with the claim that compares it with fig1a (its vanilla-2l against fig1a's
    kvshift-1l) when both were computed now, or a note in its place when one of them is kept from the old page
    (`--update`). fig1a-long's own claims stay either way."""
    by_name = {n: st for n, _, st in sections}
    LONG_CLAIM = "Paper claim (section 3.2, Figure 1a) with the longer budget"
    # The one claim that compares two sweeps (fig1a-long's vanilla-2l with fig1a's kvshift-1l), and the note
    # standing in for it; fig1a-long's own claims stay.
    CROSS_CLAIM = LONG_CLAIM + ": *2-layer vanilla learns induction"
    CROSS_NOTE = "The longer-budget claim (*2-layer vanilla learns induction"
    if "fig1a-long" in by_name and "fig1a" in by_name and ("fig1a" in kept or "fig1a-long" in kept):
        # With one of them kept from the old page it cannot be checked (and a kept one was checked against the
        # other's old numbers).
        note = ("The longer-budget claim (*2-layer vanilla learns induction but more slowly than 1-layer KV "
                "shifting*) compares with fig1a's kvshift-1l: it is checked when both sweeps are under "
                "--experiments.\n")
        sections = [(n, "\n".join(l for l in t.split("\n") if not l.startswith((CROSS_CLAIM, CROSS_NOTE)))
                     .rstrip("\n") + "\n\n" + note if n == "fig1a-long" else t, st) for n, t, st in sections]
    elif "fig1a-long" in by_name and "fig1a" in by_name:
        v2, kv1 = by_name["fig1a-long"].get("vanilla-2l"), by_name["fig1a"].get("kvshift-1l")
        if v2 and kv1 and v2.n and kv1.n:
            k = sum(r is not None for r in v2.reach)
            slower = all(r is None or r > kv1.speed for r in v2.reach)
            if k == v2.n and slower:
                word = verdict(True)
            elif k and slower:
                word = "**partly supported** (%d of %d seeds reach 90%%, all later than kvshift-1l)" % (k, v2.n)
            else:
                word = verdict(False)
            claim = (LONG_CLAIM + ": *2-layer vanilla learns induction "
                     "(≥ 90%%) but more slowly than 1-layer KV shifting*: %s — vanilla-2l ends at %s after %s steps, "
                     "%s (per seed: %s), vs fig1a's kvshift-1l %s.\n" % (
                         word, v2.acc_txt(), v2.max_steps, v2.speed_txt(),
                         ", ".join("—" if r is None else str(r) for r in v2.reach), kv1.speed_txt()))
            sections = [(n, t + "\n" + claim if n == "fig1a-long" else t, st) for n, t, st in sections]
    return sections


def main(argv):
    p = argparse.ArgumentParser(prog="results.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", default="runs/experiments", help="the sweeps' output root (sweep.py --out)")
    p.add_argument("--out", default="docs/RESULTS.md", help="the Markdown page to write")
    p.add_argument("--png-dir", help="where the plots go (default: <dir of --out>/results)")
    p.add_argument("--kvshift", default=os.path.join(ROOT, "build", "kvshift"),
                   help="the binary whose `inspect` reads the shift coefficients (default: build/kvshift)")
    p.add_argument("--note", action="append", default=[], help="a line added under the header (repeatable)")
    p.add_argument("--update", action="store_true",
                   help="keep the sections of the existing page whose sweeps are not under --experiments "
                        "(runs/ does not travel with the repository; this adds or refreshes some sections only)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.experiments):
        raise ResultsError("%s: no such directory" % args.experiments)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):  # before any plot is written
        raise ResultsError("%s: the directory of --out does not exist" % args.out)
    png_dir = args.png_dir or os.path.join(out_dir, "results")
    names = sorted(d for d in os.listdir(args.experiments)
                   if os.path.isfile(os.path.join(args.experiments, d, "sweep.json")))
    names.sort(key=lambda d: (ORDER.index(d) if d in ORDER else len(ORDER), d))
    if not names:
        raise ResultsError("%s: no sweep directories (with a sweep.json)" % args.experiments)
    sections = []
    for d in names:
        try:
            sections.append(section(os.path.join(args.experiments, d), png_dir, out_dir, args.kvshift))
        except plot_sweep.PlotError as e:
            raise ResultsError("%s: %s" % (d, e))
    if args.update and os.path.isfile(args.out):
        found = {n for n, _, _ in sections}
        for n, text in read_sections(args.out):
            if n not in found:
                sections.append((n, text, {}))
        sections.sort(key=lambda x: (ORDER.index(x[0]) if x[0] in ORDER else len(ORDER), x[0]))
    kept = [n for n, _, st in sections if st == {}]  # --update: sections from the previous page
    sections = with_cross_sweep_claim(sections, kept)
    head = git_head(ROOT)
    dirty = git_dirty(ROOT, (os.path.abspath(args.out), os.path.abspath(png_dir)))
    L = ["# Results", "",
         "Generated by `scripts/results.py` from the sweeps under `%s` — do not edit by hand. Regenerate with:" %
         rel(os.path.abspath(args.experiments), ROOT), "",
         "```sh",
         "/usr/bin/python3 scripts/results.py --experiments %s --out %s%s" % (
             rel(os.path.abspath(args.experiments), ROOT), rel(os.path.abspath(args.out), ROOT),
             " --update" if kept else ""),
         "```", "",
         "(`/usr/bin/python3 scripts/reproduce.py` runs every experiment that is missing and then this; see",
         "docs/EXPERIMENTS.md)%s." % ("; the provenance lines below were given with `--note`" if args.note else ""),
         "",
         "- generated %s at commit `%s`%s" % (
             datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), head or "unknown",
             " (with uncommitted changes)" if dirty else ""),
         "- sweeps: %s" % ", ".join(n for n, _, _ in sections)]
    if kept:
        L.append("- kept from the previous page (`--update`; their runs are not under `%s`): %s" % (
            rel(os.path.abspath(args.experiments), ROOT), ", ".join(kept)))
    L += ["- " + n for n in args.note]
    L.append("")
    text = "\n".join(L) + "\n" + "\n".join(t for _, t, _ in sections)
    tmp = args.out + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, args.out)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise ResultsError("%s: cannot write: %s" % (args.out, e.strerror or e))
    print("wrote %s (%s)" % (args.out, ", ".join(n for n, _, _ in sections)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ResultsError as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        sys.exit(1)
