#!/usr/bin/python3
"""Test of scripts/bench_cpu_scaling.py's comparison of binaries (--kvshift twice), with stand-in
binaries whose step times are fixed here, so every ratio is known:

    /usr/bin/python3 tests/test_bench_cpu_scaling.py

Checks the interleaving (A, B, A, B, ...), the per-round ratios' median and range, that
--set reaches every run, the refusal of the same binary twice, and the table's comparison
line. Prints `N passed, N failed`; exit 1 on any failure. Registered in CTest as
`bench_cpu_scaling`.
"""

import json
import os
import subprocess
import sys
import tempfile

from checks import Tally  # tests/checks.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "scripts", "bench_cpu_scaling.py")
PY = sys.executable or "/usr/bin/python3"

TALLY = Tally(quiet=True)
check = TALLY.check

# A stand-in for `kvshift bench --json`: the n-th call of this binary reports the n-th step
# time of its list, and logs its arguments (one line per call, in one log for all binaries).
FAKE = r'''#!/usr/bin/python3
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
name = os.path.basename(__file__)
times = {TIMES}
counter = os.path.join(here, name + ".count")
n = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(n + 1))
with open(os.path.join(here, "calls.log"), "a") as f:
    f.write(name + " " + " ".join(sys.argv[1:]) + "\n")
ms = times[n]
print("progress line that is not JSON")
print(json.dumps({"median_ms_per_step": ms, "median_cpu_ms_per_step": 2 * ms, "tokens_per_s": 2048e3 / ms,
                  "model_tflops_per_s": 0.1, "fraction_of_sgemm_peak": 0.5, "sgemm_peak_gflops": 100.0,
                  "openblas_core": "Zen", "openblas_core_source": "test", "loadavg_1min": 0.5}))
'''


def fake(dir_, name, times):
    path = os.path.join(dir_, name)
    with open(path, "w") as f:
        f.write(FAKE.replace("{TIMES}", repr(times)))
    os.chmod(path, 0o755)
    return path


def run(args):
    return subprocess.run([PY, TOOL] + args, capture_output=True, text=True)


def main():
    with tempfile.TemporaryDirectory() as d:
        # Per-round ratios A/B: 300/200 = 1.5, 330/300 = 1.1, 310/250 = 1.24, 400/250 = 1.6: median 1.37.
        a = fake(d, "before", [300.0, 330.0, 310.0, 400.0])
        b = fake(d, "after", [200.0, 300.0, 250.0, 250.0])
        common = ["--config", "c.json", "--threads", "2", "--rounds", "4", "--steps", "3", "--warmup", "1",
                  "--set", "train.seq_len=128", "--kvshift", a, "--kvshift", b]
        p = run(common + ["--json"])
        check(p.returncode == 0, "two binaries run", p.stderr)
        out = json.loads(p.stdout)
        cmp = out["comparisons"]
        check(len(cmp) == 1, "one comparison for one (config, threads, core)", cmp)
        c = cmp[0]
        check(c["baseline"] == a and c["kvshift"] == b, "the first binary is the baseline", c)
        check(abs(c["speedup_median"] - (1.24 + 1.5) / 2) < 1e-9, "median of the per-round ratios", c)
        check(abs(c["speedup_min"] - 1.1) < 1e-9 and abs(c["speedup_max"] - 1.6) < 1e-9, "their range", c)
        check(c["rounds"] == 4, "four rounds", c)
        runs = {r["kvshift"]: r for r in out["runs"]}
        check(abs(runs[a]["median_ms_per_step"] - 320.0) < 1e-9, "A's median step over rounds", runs[a])
        check(abs(runs[b]["median_ms_per_step"] - 250.0) < 1e-9, "B's median step over rounds", runs[b])
        calls = open(os.path.join(d, "calls.log")).read().splitlines()
        check([c.split()[0] for c in calls] == ["before", "after"] * 4, "the binaries alternate", calls)
        check(all("--set train.seq_len=128" in c and "--set train.threads=2" in c for c in calls),
              "--set and the threads reach every run", calls[0])

        for name in ("before", "after"):
            os.remove(os.path.join(d, name + ".count"))
        p = run(common)
        check(p.returncode == 0, "the table", p.stderr)
        check("after is 1.370x" in p.stdout.replace(d + "/", "") and "range 1.100-1.600" in p.stdout,
              "the table's comparison line", p.stdout)

        p = run(["--config", "c.json", "--threads", "1", "--kvshift", a, "--kvshift", a])
        check(p.returncode != 0 and "the same binary twice" in p.stderr, "the same binary twice is refused",
              p.stderr)
    return TALLY.finish()


if __name__ == "__main__":
    sys.exit(main())
