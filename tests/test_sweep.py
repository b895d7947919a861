#!/usr/bin/python3
"""End-to-end test of scripts/sweep.py and scripts/plot_sweep.py with the real binary.

    /usr/bin/python3 tests/test_sweep.py --kvshift build/kvshift --workdir build/sweep_test

Runs configs/experiments/smoke.json (2 labels x 2 seeds, 20 steps each) into a
fresh WORKDIR and checks: all cells finish, a second run re-runs nothing, an
interrupted cell (with and without a checkpoint) is the only one that re-runs,
a spec with an unknown key fails with one line naming it, a failing cell does
not stop the sweep but makes the exit status non-zero, and plot_sweep.py writes
a PNG and a table with both labels; reproduce.py keeps the results page's other
sections, prepares the data of every spec that reads data/ and hands the
prepare step an absolute kvshift; a Ctrl-C to the process group of sweep.py or
reproduce.py, or a SIGTERM to sweep.py, stops every run after one checkpoint,
leaves no trainer behind and no cell `running`, and a rerun resumes. Prints
`N passed, N failed`; exit 1 on any failure. Registered in CTest as `sweep_runner`.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from checks import Tally  # tests/checks.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(ROOT, "scripts", "sweep.py")
PLOT = os.path.join(ROOT, "scripts", "plot_sweep.py")
REPRODUCE = os.path.join(ROOT, "scripts", "reproduce.py")
RESULTS = os.path.join(ROOT, "scripts", "results.py")
SMOKE = os.path.join(ROOT, "configs", "experiments", "smoke.json")
PY = sys.executable or "/usr/bin/python3"

TALLY = Tally(quiet=False)
check = TALLY.check

def run(args, **kw):
    p = subprocess.run([PY] + args, capture_output=True, text=True, **kw)
    return p


def show(p):
    return "rc %d\n--- stdout\n%s--- stderr\n%s" % (p.returncode, p.stdout, p.stderr)


def cell_dirs(out):
    return {(lab, s): os.path.join(out, "smoke", lab, "seed%d" % s)
            for lab in ("kvshift", "vanilla") for s in (1, 2)}


def is_finished(run_dir, steps=20):
    if not os.path.isfile(os.path.join(run_dir, "checkpoints", "latest")):
        return False
    last = None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "train":
                last = rec["step"]
    return last == steps


def stamps(dirs):
    """mtime_ns of every cell's metrics.jsonl and checkpoints/latest."""
    out = {}
    for key, d in dirs.items():
        for name in ("metrics.jsonl", os.path.join("checkpoints", "latest"), "train.log"):
            p = os.path.join(d, name)
            out[(key, name)] = os.stat(p).st_mtime_ns if os.path.exists(p) else None
    return out


def sweep_json(out):
    with open(os.path.join(out, "smoke", "sweep.json")) as f:
        return json.load(f)


def statuses(out):
    return {(c["label"], c["seed"]): (c["status"], c["action"]) for c in sweep_json(out)["cells"]}


def truncate_metrics(run_dir, max_step):
    p = os.path.join(run_dir, "metrics.jsonl")
    with open(p) as f:
        keep = [l for l in f if json.loads(l)["step"] <= max_step]
    with open(p, "w") as f:
        f.writelines(keep)


def trainers(path):
    """PIDs of the processes whose command line has `train` and names something under `path`
    (from /proc: the kvshift runs of a sweep writing there)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"train" in argv[1:2] and any(path.encode() in a for a in argv[2:]):
            pids.append(int(d))
    return pids


def leftover_trainers(path):
    """trainers(path), each then killed (a failed check must not leave them running)."""
    pids = trainers(path)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def start_and_stop(cmd, metrics, sig, group):
    """Start cmd (a session of its own), wait for a train line in every `metrics` file, then send
    `sig` to its process group (a terminal's Ctrl-C) or to it alone. Returns the CompletedProcess."""
    p = subprocess.Popen([PY] + cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline:
        if all(os.path.isfile(m) and os.path.getsize(m) > 0 for m in metrics):
            break
        time.sleep(0.02)
    if p.poll() is None:
        (os.killpg if group else os.kill)(p.pid, sig)
    try:
        out, err = p.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def sweep_threads_default(jobs):
    """The threads sweep.py gives each run at --jobs `jobs` (sweep.cpu_count() // jobs)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import sweep  # noqa: E402
    return max(1, sweep.cpu_count() // jobs)


def checkpoint_step(run_dir):
    try:
        with open(os.path.join(run_dir, "checkpoints", "latest")) as f:
            return int(f.read().strip()[5:])
    except (OSError, ValueError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvshift", required=True)
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    work = os.path.abspath(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = os.path.join(work, "runs")
    base = ["--spec", SMOKE, "--kvshift", a.kvshift, "--out", out]
    dirs = cell_dirs(out)

    # 0. Dry run: a plan, nothing written.
    p = run([SWEEP] + base + ["--dry-run"])
    check(p.returncode == 0 and "4 cells" in p.stdout and "4 todo" in p.stdout, "dry run prints the plan", show(p))
    check(not os.path.exists(out), "dry run writes nothing")

    # 1. Fresh sweep, two cells in parallel.
    p = run([SWEEP] + base + ["--jobs", "2"])
    if not check(p.returncode == 0, "fresh sweep exits 0", show(p)):
        print(show(p))
    check("0 finished, 4 todo" in p.stdout, "plan says 0 finished, 4 todo", p.stdout)
    check(sum(l.startswith("[") and "final accuracy" in l for l in p.stdout.splitlines()) == 4,
          "one progress line per cell", p.stdout)
    check(all(is_finished(d) for d in dirs.values()), "all 4 run dirs finished")
    st = statuses(out)
    check(len(st) == 4 and all(v == ("finished", "started") for v in st.values()),
          "sweep.json: 4 cells finished/started", str(st))
    cells = sweep_json(out)["cells"]
    check(all(c["final_eval"] and c["final_eval"]["step"] == 20 and 0 <= c["final_eval"]["accuracy"] <= 1
              and c["wall_s"] > 0 for c in cells), "sweep.json: final eval metrics and wall time", json.dumps(cells))
    with open(os.path.join(dirs[("vanilla", 2)], "config.json")) as f:
        cfg = json.load(f)
    check(cfg["train"]["seed"] == 2 and cfg["model"]["kv_shift"]["enabled"] is False
          and cfg["model"]["hidden_size"] == 32 and cfg["train"]["threads"] >= 1,
          "cell config carries seed, grid and spec overrides", json.dumps(cfg["train"]))

    # 2. Again: nothing re-runs.
    before = stamps(dirs)
    p = run([SWEEP] + base)
    check(p.returncode == 0 and "4 finished, 0 todo" in p.stdout, "second sweep: 4 finished, 0 todo", show(p))
    check(stamps(dirs) == before, "second sweep touched no run dir")
    check(all(v == ("finished", "skipped") for v in statuses(out).values()), "sweep.json: all skipped")

    # 3a. Interrupted without a checkpoint: latest removed, metrics truncated -> only that cell restarts.
    victim = dirs[("vanilla", 2)]
    os.remove(os.path.join(victim, "checkpoints", "latest"))
    truncate_metrics(victim, 10)
    before = stamps(dirs)
    p = run([SWEEP] + base)
    check(p.returncode == 0 and "3 finished, 1 todo" in p.stdout, "interrupted cell: plan says 1 todo", show(p))
    after = stamps(dirs)
    others_same = all(after[k] == before[k] for k in before if k[0] != ("vanilla", 2))
    check(others_same, "interrupted cell: other cells untouched")
    check(is_finished(victim), "interrupted cell (no checkpoint) finished again")
    check(statuses(out)[("vanilla", 2)] == ("finished", "restarted"), "sweep.json: restarted",
          str(statuses(out)))

    # 3b. Interrupted after the step-10 checkpoint -> resumed with --resume.
    victim = dirs[("kvshift", 1)]
    with open(os.path.join(victim, "checkpoints", "latest"), "w") as f:
        f.write("step_00000010\n")
    truncate_metrics(victim, 10)
    if sweep_threads_default(2) != sweep_threads_default(1):  # a resumed cell keeps its count; the plan says so
        p = run([SWEEP] + base + ["--dry-run", "--jobs", "1"])
        check(p.returncode == 0 and "1 resumed cell keeps the %d it started with" % sweep_threads_default(2)
              in p.stdout and "train.threads=%d" % sweep_threads_default(2) in p.stdout,
              "plan: a resumed cell keeps its thread count, and the plan says so", show(p))
    before = stamps(dirs)
    p = run([SWEEP] + base)
    check(p.returncode == 0 and "1 todo" in p.stdout, "checkpointed cell: plan says 1 todo", show(p))
    after = stamps(dirs)
    check(all(after[k] == before[k] for k in before if k[0] != ("kvshift", 1)),
          "checkpointed cell: other cells untouched")
    check(is_finished(victim), "checkpointed cell finished")
    check(statuses(out)[("kvshift", 1)] == ("finished", "resumed"), "sweep.json: resumed", str(statuses(out)))
    with open(os.path.join(victim, "metrics.jsonl")) as f:
        steps = [json.loads(l)["step"] for l in f if json.loads(l)["type"] == "train"]
    check(steps == [10, 20], "resumed cell logs each train step once", str(steps))
    with open(os.path.join(victim, "train.log")) as f:
        check("--resume" in f.read(), "resumed cell ran with --resume")

    # 4. Unknown keys: one line naming the key and the file, exit 1.
    with open(SMOKE) as f:
        spec = json.load(f)
    spec["base"] = os.path.join(ROOT, "configs", "toy", "induction-1l-kvshift.json")
    bad = dict(spec, seedz=[3])
    bad_path = os.path.join(work, "bad.json")
    with open(bad_path, "w") as f:
        json.dump(bad, f)
    p = run([SWEEP, "--spec", bad_path, "--kvshift", a.kvshift, "--out", out])
    lines = p.stderr.strip().splitlines()
    check(p.returncode == 1 and len(lines) == 1 and "'seedz'" in lines[0] and bad_path in lines[0],
          "unknown top-level key: one-line error naming key and file", show(p))
    bad = json.loads(json.dumps(spec))
    bad["grid"][1]["sett"] = {}
    with open(bad_path, "w") as f:
        json.dump(bad, f)
    p = run([SWEEP, "--spec", bad_path, "--kvshift", a.kvshift, "--out", out])
    lines = p.stderr.strip().splitlines()
    check(p.returncode == 1 and len(lines) == 1 and "sett" in lines[0] and bad_path in lines[0],
          "unknown grid key: one-line error naming key and file", show(p))

    # 5. A failing cell is recorded, the others still run, exit status non-zero.
    failing = dict(spec, name="failing", seeds=[1],
                   grid=[{"label": "broken", "set": {"model.hidden_size": 30}},
                         {"label": "fine", "set": {}}])
    fail_path = os.path.join(work, "failing.json")
    with open(fail_path, "w") as f:
        json.dump(failing, f)
    p = run([SWEEP, "--spec", fail_path, "--kvshift", a.kvshift, "--out", out])
    check(p.returncode != 0, "failing cell: non-zero exit", show(p))
    check("FAILED" in p.stdout and "hidden_size" in p.stdout, "failing cell: its error lines are printed", show(p))
    with open(os.path.join(out, "failing", "sweep.json")) as f:
        fst = {c["label"]: c["status"] for c in json.load(f)["cells"]}
    check(fst == {"broken": "failed", "fine": "finished"}, "failing cell: recorded, the sweep continued", str(fst))

    # 6. Plot and table.
    png = os.path.join(work, "smoke.png")
    p = run([PLOT, "--sweep", os.path.join(out, "smoke"), "--out", png])
    check(p.returncode == 0, "plot_sweep exits 0", show(p))
    ok_png = os.path.isfile(png) and os.path.getsize(png) > 1000
    if ok_png:
        with open(png, "rb") as f:
            ok_png = f.read(8) == b"\x89PNG\r\n\x1a\n"
    check(ok_png, "plot_sweep wrote a PNG")
    rows = [l for l in p.stdout.splitlines() if l.startswith("| kvshift") or l.startswith("| vanilla")]
    check(len(rows) == 2 and all("| 2 |" in r for r in rows), "table has both labels with 2 seeds", p.stdout)
    p = run([PLOT, "--sweep", os.path.join(out, "smoke"), "--table-only", "--metric", "val_loss"])
    lines = p.stdout.strip().splitlines()
    check(p.returncode == 0 and len(lines) == 4 and all(l.startswith("|") for l in lines),
          "--table-only prints just the Markdown table", show(p))

    # 7. --seed selects seeds; reproduce.py plans, runs and writes a results page.
    out2 = os.path.join(work, "runs2")
    p = run([SWEEP, "--spec", SMOKE, "--kvshift", a.kvshift, "--out", out2, "--seed", "2"])
    ran = sorted(os.listdir(os.path.join(out2, "smoke", "kvshift"))) if p.returncode == 0 else []
    check(p.returncode == 0 and "2 of 4 cells" in p.stdout and ran == ["seed2"], "--seed 2 runs only seed-2 cells",
          show(p))
    p = run([SWEEP, "--spec", SMOKE, "--kvshift", a.kvshift, "--out", out2, "--seed", "7"])
    check(p.returncode == 1 and "--seed 7" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
          "--seed with an unknown seed: one-line error", show(p))
    empty = os.path.join(work, "empty")  # nothing finished there, whatever runs/ holds
    p = run([REPRODUCE, "--dry-run", "--out", empty])
    names = ["fig1a", "fig3", "hopk", "fig1b", "fig8", "fig1a-long", "lm-text"]
    check(p.returncode == 0 and "expected time:" in p.stdout and all(n in p.stdout for n in names),
          "reproduce --dry-run plans the whole suite with an expected time", show(p))
    p = run([REPRODUCE, "--dry-run", "--quick", "--out", empty])
    check(p.returncode == 0 and "quick subset" in p.stdout and " 5 cells to run" in p.stdout
          and "fig8" not in p.stdout, "reproduce --quick plans fig1a with one seed per model (5 cells)", show(p))
    page = os.path.join(work, "results", "RESULTS.md")
    os.makedirs(os.path.dirname(page))
    with open(page, "w") as f:  # a committed page has sections of sweeps this checkout has not run
        f.write("# Results\n\n## fig8\n\nan older section, kept\n")
    p = run([REPRODUCE, "--spec", "smoke", "--kvshift", a.kvshift, "--out", out2, "--results", page, "--jobs", "2"])
    text = open(page).read() if os.path.isfile(page) else ""
    check(p.returncode == 0 and "## smoke" in text and "| kvshift |" in text
          and os.path.isfile(os.path.join(work, "results", "results", "smoke.png")),
          "reproduce --spec smoke runs the missing cells and writes the page with its plot", show(p))
    check("an older section, kept" in text and "sweeps: fig8, smoke" in text,
          "reproduce --spec smoke keeps the page's fig8 section (results.py --update)",
          next((l for l in text.splitlines() if l.startswith("- sweeps:")), "no sweeps line"))
    # 8. results.py --update keeps the sections of sweeps it does not find (runs/ is not in the repository).
    p = run([RESULTS, "--experiments", out2, "--out", page, "--kvshift", a.kvshift, "--update"])
    text = open(page).read() if os.path.isfile(page) else ""
    check(p.returncode == 0 and "## smoke" in text and "an older section, kept" in text
          and text.index("## fig8") < text.index("## smoke") and "sweeps: fig8, smoke" in text,
          "results.py --update refreshes smoke, keeps fig8 in its place", show(p))
    check("- kept from the previous page (`--update`" in text and ": fig8" in text
          and "--out %s --update" % os.path.relpath(page, ROOT) in text,
          "results.py --update: the header names the kept sections and its command has --update",
          next((l for l in text.splitlines() if "kept from" in l), text[:600]))
    p = run([RESULTS, "--experiments", out2, "--out", page, "--kvshift", a.kvshift])
    text = open(page).read() if os.path.isfile(page) else ""
    check(p.returncode == 0 and "older section" not in text, "without --update the page is rebuilt from the runs",
          show(p))
    p = run([REPRODUCE, "--spec", "nosuch", "--dry-run"])
    check(p.returncode == 1 and "nosuch" in p.stderr, "reproduce: unknown spec is a one-line error", show(p))

    # 9. reproduce.py prepares the data of every spec that reads data/ (a fresh clone has none),
    #    and the prepare step (prepare_corpus.sh cd's to the repository root) gets an absolute kvshift.
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import reproduce  # noqa: E402
    import sweep  # noqa: E402
    data_dir = os.path.join(ROOT, "data") + os.sep
    missing = []
    for fn in sorted(os.listdir(reproduce.SPEC_DIR)):
        spec_i = sweep.load_spec(os.path.join(reproduce.SPEC_DIR, fn))
        with open(spec_i["base_path"]) as f:
            data = json.load(f).get("data", {})
        globs = data.get("shards", {}).get("train", []) + data.get("shards", {}).get("val", [])
        dirs = {os.path.dirname(os.path.normpath(os.path.join(os.path.dirname(spec_i["base_path"]), g)))
                for g in globs}
        for d in sorted(x for x in dirs if x.startswith(data_dir)):
            prep = reproduce.PREPARE.get(fn[:-5])
            if prep is None or os.path.dirname(prep[1]) != d:
                missing.append("%s reads %s" % (fn, d))
            elif prep[0][0].endswith(".py") or "python" in prep[0][0]:
                if prep[0][0] != "/usr/bin/python3":
                    missing.append("%s: %s (the shards depend on the interpreter)" % (fn, prep[0]))
    check(not missing, "reproduce.PREPARE makes the data of every spec that reads data/", "; ".join(missing))
    kv_abs = os.path.abspath(a.kvshift)
    marker, never = os.path.join(work, "prepare-ran"), os.path.join(work, "no-manifest.json")
    # smoke with a stand-in prepare step that runs $KVSHIFT from the repository root, then fails
    # (so no sweep runs), with --kvshift ./kvshift relative to the binary's directory.
    prep = ["bash", "-c", 'cd "$0" && "$KVSHIFT" --help > "$1"; exit 1', ROOT, marker]
    code = ("import sys; sys.path.insert(0, %r); import reproduce; reproduce.PREPARE['smoke'] = (%r, %r); "
            "sys.exit(reproduce.main(sys.argv[1:]))" % (os.path.join(ROOT, "scripts"), prep, never))
    p = run(["-c", code, "--spec", "smoke", "--kvshift", "./" + os.path.basename(kv_abs),
             "--out", os.path.join(work, "runs-prep"),
             "--results", os.path.join(work, "prep.md")], cwd=os.path.dirname(kv_abs))
    ran = open(marker).read() if os.path.isfile(marker) else ""
    check("Usage:" in ran and "FAILED: smoke" in p.stdout, "reproduce: the prepare step gets an absolute KVSHIFT "
          "(a relative --kvshift still works from the repository root)", show(p))

    # 10. Stopping a sweep: every run gets one stop request and writes its checkpoint first.
    long_spec = dict(spec, name="long", seeds=[1],
                     set=dict(spec["set"], **{"train.steps": 100000, "train.checkpoint_every": 0,
                                              "train.eval_every": 0, "train.log_every": 1}))
    long_path = os.path.join(work, "long.json")
    with open(long_path, "w") as f:
        json.dump(long_spec, f)

    def stopped(outdir, what, p, code):
        """The checks after a stop: exit code, a checkpoint per run, no trainer left, nothing `running`."""
        root = os.path.join(outdir, "long")
        run_dirs = [os.path.join(root, lab, "seed1") for lab in ("kvshift", "vanilla")]
        left = leftover_trainers(outdir)
        check(p.returncode == code, "%s: exit status %d" % (what, code), show(p))
        check(all(checkpoint_step(d) for d in run_dirs), "%s: both runs wrote a checkpoint" % what,
              show(p) + "".join(open(os.path.join(d, "train.log")).read() for d in run_dirs
                                if os.path.isfile(os.path.join(d, "train.log"))))
        check(not left, "%s: no kvshift left running" % what, "killed %s" % left)
        with open(os.path.join(root, "sweep.json")) as f:
            st = [c["status"] for c in json.load(f)["cells"]]
        check(st == ["interrupted", "interrupted"], "%s: sweep.json says interrupted" % what, str(st))
        return run_dirs

    # 10a. Ctrl-C at a terminal: SIGINT to the whole process group (kvshift used to get it too,
    #      then sweep.py's SIGTERM as a second signal: an exit without a checkpoint).
    out3 = os.path.join(work, "runs3")
    cmd = [SWEEP, "--spec", long_path, "--kvshift", a.kvshift, "--out", out3, "--jobs", "2"]
    metrics = [os.path.join(out3, "long", lab, "seed1", "metrics.jsonl") for lab in ("kvshift", "vanilla")]
    p = start_and_stop(cmd, metrics, signal.SIGINT, group=True)
    run_dirs = stopped(out3, "sweep Ctrl-C", p, 130)
    # Rerun to just past the checkpoints (train.steps may change on resume): both resume and finish.
    end = max(checkpoint_step(d) or 0 for d in run_dirs) + 3
    long_spec["set"]["train.steps"] = end
    with open(long_path, "w") as f:
        json.dump(long_spec, f)
    p = run(cmd)
    with open(os.path.join(out3, "long", "sweep.json")) as f:
        st = [(c["status"], c["action"]) for c in json.load(f)["cells"]]
    check(p.returncode == 0 and "0 finished, 2 todo" in p.stdout and st == [("finished", "resumed")] * 2
          and all(is_finished(d, end) for d in run_dirs), "sweep Ctrl-C: a rerun resumes both and finishes",
          show(p) + str(st))
    long_spec["set"]["train.steps"] = 100000
    with open(long_path, "w") as f:
        json.dump(long_spec, f)

    # 10b. SIGTERM to sweep.py alone (timeout, a parent): the same, instead of orphaned trainers.
    out4 = os.path.join(work, "runs4")
    cmd = [SWEEP, "--spec", long_path, "--kvshift", a.kvshift, "--out", out4, "--jobs", "2"]
    metrics = [os.path.join(out4, "long", lab, "seed1", "metrics.jsonl") for lab in ("kvshift", "vanilla")]
    p = start_and_stop(cmd, metrics, signal.SIGTERM, group=False)
    stopped(out4, "sweep SIGTERM", p, 143)
    p = run(cmd + ["--dry-run"])
    check(p.stdout.count("(resume: checkpoint at step") == 2, "sweep SIGTERM: a rerun would resume both", show(p))

    # 10d. A trainer stopped by a signal of its own (a scheduler's SIGTERM to it, not to sweep.py):
    #      recorded as interrupted after its checkpoint, not failed; the sweep goes on and exits 1.
    out6 = os.path.join(work, "runs6")
    p6 = subprocess.Popen([PY, SWEEP, "--spec", long_path, "--kvshift", a.kvshift, "--out", out6, "--only", "kvshift"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    m6 = os.path.join(out6, "long", "kvshift", "seed1", "metrics.jsonl")
    deadline = time.monotonic() + 60
    while p6.poll() is None and time.monotonic() < deadline and not (os.path.isfile(m6) and os.path.getsize(m6)):
        time.sleep(0.02)
    for pid in trainers(out6):
        os.kill(pid, signal.SIGTERM)
    try:
        out, err = p6.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.kill(p6.pid, signal.SIGKILL)
        out, err = p6.communicate()
    left = leftover_trainers(out6)
    with open(os.path.join(out6, "long", "sweep.json")) as f:
        cell = json.load(f)["cells"][0]
    check(p6.returncode == 1 and "1 stopped by a signal (kvshift seed1" in out and cell["status"] == "interrupted"
          and "after its checkpoint (exit status 75); next: resume" in cell.get("error", "")
          and checkpoint_step(os.path.dirname(m6)) and not left,
          "sweep: a trainer's own stop signal is an interruption after its checkpoint, not a failure",
          "rc %s\n%s%s%s" % (p6.returncode, out[-800:], err[-400:], cell))

    # 10c. Ctrl-C at reproduce.py: it waits for sweep.py's cleanup and says how to continue.
    out5 = os.path.join(work, "runs5")
    cmd = [REPRODUCE, "--quick", "--kvshift", a.kvshift, "--out", out5, "--results", os.path.join(work, "q.md")]
    metrics = [os.path.join(out5, "fig1a", lab, "seed1", "metrics.jsonl") for lab in ("vanilla-1l", "vanilla-2l")]
    p = start_and_stop(cmd, metrics, signal.SIGINT, group=True)
    left = leftover_trainers(out5)
    check(p.returncode == 130 and "interrupted; run the same command again" in p.stderr
          and "Traceback" not in p.stderr, "reproduce Ctrl-C: exit 130 with its message, no traceback", show(p))
    check(not left, "reproduce Ctrl-C: no kvshift left running", "killed %s" % left)
    check(all(checkpoint_step(os.path.dirname(m)) for m in metrics), "reproduce Ctrl-C: the runs wrote checkpoints",
          show(p))
    try:
        with open(os.path.join(out5, "fig1a", "sweep.json")) as f:
            st = [c["status"] for c in json.load(f)["cells"]]
    except (OSError, ValueError) as e:
        st = [str(e)]
    check("running" not in st and st.count("interrupted") == 2, "reproduce Ctrl-C: sweep.json records the stop",
          str(st))

    # 11. results.py's claims on partial data: seeds pair by number, a null accuracy is no data.
    import results  # noqa: E402

    def seed(n, **last):
        return {"seed": n, "evals": [dict(step=10, **last)], "finished": True, "final": True, "steps": 10}
    lm = results.lm_text_claims({"kvshift": [seed(1, val_loss=5.00), seed(3, val_loss=5.20)],
                                 "vanilla": [seed(1, val_loss=5.05), seed(2, val_loss=4.00),
                                             seed(3, val_loss=5.25)]})
    per_seed = next((line for line in lm if line.startswith("Per seed")), "")
    check("seed 1 -0.0500, seed 3 -0.0500; KV shifting is lower in 2 of 2 seeds" in per_seed,
          "results lm-text: per-seed differences pair the same seed (vanilla's seed 2 has no partner)", per_seed)
    lm = results.lm_text_claims({"kvshift": [seed(1, val_loss=5.0)], "vanilla": [seed(2, val_loss=5.1)]})
    check(any("no seed has a final validation loss for both" in line for line in lm),
          "results lm-text: no common seed is said, not an empty list", str(lm))
    stats = {k: results.LabelStats(k, [seed(1, accuracy=0.99 if k != "kvshift-1l" else None)], 10)
             for k in ("vanilla-1l", "vanilla-2l", "vanilla-4l", "kvshift-1l")}
    try:
        fig1a = results.fig1a_claims(stats)
    except TypeError as e:
        fig1a = ["TypeError: %s" % e]
    check(fig1a == ["Claims not evaluated: no data for kvshift-1l."],
          "results fig1a: a null final accuracy (a diverged run) is no data", str(fig1a))

    # 11b. A tie with kvshift-1l is said beside kvshift-1l, not after the last of the others.
    stats = {k: results.LabelStats(k, [seed(1, accuracy=0.99 if k.startswith("kvshift") else 0.1)], 10)
             for k in ("vanilla-1l", "vanilla-2l", "vanilla-4l", "kvshift-1l", "kvshift-2l")}
    first = results.fig1a_claims(stats)[0]
    check("kvshift-1l ends at 99.0% ± 0.0, 10 steps to 90% (tied with kvshift-2l); the others:" in first
          and first.endswith("kvshift-2l 10 steps to 90%."), "results fig1a: a tie is named beside kvshift-1l", first)

    # 11c. results.py --update with fig1a recomputed and fig1a-long kept: only the claim comparing the two
    #      sweeps gives way to the note (once, however often it runs); fig1a-long's own claim stays.
    own = ("Paper claim (section 3.2, Figure 1a) with the longer budget: *4-layer vanilla is no faster than "
           "2-layer vanilla*: **not supported** — numbers")
    cross = ("Paper claim (section 3.2, Figure 1a) with the longer budget: *2-layer vanilla learns induction "
             "(≥ 90%) but more slowly than 1-layer KV shifting*: **partly supported** — numbers")
    kept_long = "## fig1a-long\n\ntable\n\n%s\n\n%s\n" % (own, cross)
    merged = results.with_cross_sweep_claim([("fig1a", "## fig1a\n", {"kvshift-1l": None}),
                                             ("fig1a-long", kept_long, {})], ["fig1a-long"])
    again = results.with_cross_sweep_claim([("fig1a", "## fig1a\n", {"kvshift-1l": None}),
                                            ("fig1a-long", merged[1][1], {})], ["fig1a-long"])
    long_text = again[1][1]
    check(own in long_text and cross not in long_text and long_text.count("The longer-budget claim") == 1,
          "results --update: fig1a-long keeps its own claim, the cross-sweep one becomes one note", long_text)

    # 11d. Bad specs: one line each, no traceback; an empty seed_keys is refused (every seed the same run).
    for what, text in [("not UTF-8", b"\xff\xfe{}"), ("NaN", None), ("1e400", None), ("seed_keys []", None),
                       ("base a directory", None)]:
        bad = json.loads(json.dumps(spec))
        if what == "NaN":
            text = json.dumps(dict(bad, estimate_seconds_per_run=1)).replace('"estimate_seconds_per_run": 1',
                                                                             '"estimate_seconds_per_run": NaN')
        elif what == "1e400":
            text = json.dumps(dict(bad, estimate_seconds_per_run=1)).replace('"estimate_seconds_per_run": 1',
                                                                             '"estimate_seconds_per_run": 1e400')
        elif what == "seed_keys []":
            text = json.dumps(dict(bad, seed_keys=[]))
        elif what == "base a directory":
            text = json.dumps(dict(bad, base=os.path.dirname(bad["base"])))
        with open(bad_path, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode())
        p = run([SWEEP, "--spec", bad_path, "--kvshift", a.kvshift, "--out", os.path.join(work, "runs"), "--dry-run"])
        lines = p.stderr.strip().splitlines()
        check(p.returncode == 1 and len(lines) == 1 and bad_path in lines[0] and "Traceback" not in p.stderr
              and (what != "seed_keys []" or "seed_keys" in lines[0])
              and (what != "base a directory" or "is a directory" in lines[0]),
              "sweep: a spec with %s is a one-line error" % what, show(p))
    check(sweep.exit_text(-9) == "killed by SIGKILL" and sweep.exit_text(1) == "exit status 1",
          "sweep: a killed run's status names the signal", sweep.exit_text(-9))

    # 11e. reproduce --spec says which specs, not "whole suite"; plot_sweep warns about a sweep.json it cannot read.
    p = run([REPRODUCE, "--spec", "smoke", "--dry-run", "--out", empty])
    check(p.returncode == 0 and "reproduce: spec smoke," in p.stdout and "whole suite" not in p.stdout,
          "reproduce --spec names the spec it runs", show(p))
    broken = os.path.join(work, "broken_sweep")
    shutil.copytree(os.path.join(work, "runs", "smoke"), broken)
    with open(os.path.join(broken, "sweep.json"), "w") as f:
        f.write("{not json")
    p = run([PLOT, "--sweep", broken, "--table-only"])
    check(p.returncode == 0 and "warning" in p.stderr and "sweep.json" in p.stderr and "| kvshift" in p.stdout,
          "plot_sweep: a corrupt sweep.json is a warning, the cells come from the directories", show(p))

    # 12. Final numbers come only from seeds with an evaluation at their last step: an interrupted
    #     seed (last eval earlier), a finished seed whose final eval line was cut, and a run directory
    #     gone from a finished sweep are named, not averaged in.
    part = os.path.join(work, "partial", "toy")
    cells = []
    for s_, (status, evals, cut) in {1: ("finished", [(50, 0.5), (100, 0.9)], False),
                                     2: ("interrupted", [(50, 0.1)], False),
                                     3: ("finished", [(50, 0.2), (100, 0.95)], True),
                                     4: ("finished", None, False)}.items():
        cells.append({"label": "kvshift", "seed": s_, "status": status, "steps": 100})
        if evals is None:
            continue  # the run directory is gone
        d = os.path.join(part, "kvshift", "seed%d" % s_)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"train": {"steps": 100, "micro_batch_size": 1, "grad_accum_steps": 1, "seq_len": 8}}, f)
        lines = [json.dumps({"type": "train", "step": st, "loss": 1.0}) for st, _ in evals if status == "finished"]
        lines += [json.dumps({"type": "eval", "step": st, "accuracy": acc, "val_loss": 1 - acc}) for st, acc in evals]
        text = "\n".join(lines) + "\n"
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.write(text[:len(text) - len(lines[-1]) // 2 - 1] if cut else text)
    with open(os.path.join(part, "sweep.json"), "w") as f:
        json.dump({"name": "toy", "seeds": [1, 2, 3, 4], "cells": cells}, f)
    partial_page = os.path.join(work, "partial", "R.md")
    p = run([RESULTS, "--experiments", os.path.dirname(part), "--out", partial_page, "--kvshift", a.kvshift])
    text = open(partial_page).read() if os.path.isfile(partial_page) else ""
    row = next((l for l in text.splitlines() if l.startswith("| kvshift |")), "")
    check(p.returncode == 0 and "| 1 (2/4 finished) | 90.0% ± 0.0 |" in row,
          "results: the final accuracy is seed 1's alone (the others have no eval at step 100)", row or show(p))
    left = next((l for l in text.splitlines() if "not in the final numbers" in l), "")
    check("`kvshift` seed 2 (not finished, last evaluation at step 50 of 100)" in left
          and "`kvshift` seed 3 (last evaluation at step 50 of 100)" in left
          and "`kvshift` seed 4 (no metrics.jsonl or no evaluation in it)" in left,
          "results: the interrupted seed, the cut final line and the missing run are named", left or text[-400:])

    return TALLY.finish()


if __name__ == "__main__":
    sys.exit(main())
