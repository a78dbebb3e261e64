"""`qsync-opt profile` from an empty cache: an older commit's profiler against this tree's, side by side.

Each round profiles the same spec twice, the old code then the new (A B A B ...), each exactly as a user runs it:
`python -m qsync_opt.cli profile SPEC -o FILE --quiet` in a fresh process, into a fresh file and cache folder. The
old code is `git archive REV qsync_opt` unpacked into a temporary folder, first on that process's PYTHONPATH and its
working directory (so that `-m` cannot import this tree's package instead).

    PYTHONPATH=. python benchmarks/profile_speed.py --out DIR [--spec examples/cpu_tiny.yaml] [--rounds 3] [--old 7f2e188]

Per round: the wall seconds of each, old / new, the machine's 1-minute load before each run, and how far the two
profiles' costs lie apart: over every op signature both hold (every section), |new − old| / old of the op's
forward + backward ms, the largest and the median; the same for the whole steps (section, step key, precision).
The same figures between this round's old run and the previous round's (old vs old) are the noise they are to be
read against. Writes DIR/profile_speed.csv (the command, CPU model and revisions in its header) and prints the table.

--smoke: one round of examples/cpu_tiny.yaml with fp32 only, the estimator at its fewest calls (benchmarks/_smoke.py).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qsync_opt.io import atomic_write_text  # noqa: E402

#: The last commit before the profiler took each distinct op once and its whole steps adaptively.
OLD = "7f2e188"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def export(rev: str, into: Path) -> Path:
    """`git archive rev qsync_opt` unpacked under `into`; exit 2 naming --old when git cannot."""
    into.mkdir(parents=True, exist_ok=True)
    arc = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "qsync_opt"], capture_output=True)
    if arc.returncode != 0:
        raise SystemExit(f"error: --old {rev}: git archive failed ({arc.stderr.decode().strip()}); give a commit of "
                         "this repository's history (a shallow clone may lack it)")
    subprocess.run(["tar", "-x", "-C", str(into)], input=arc.stdout, check=True)
    return into


def profile_once(code: Path, spec: Path, work: Path) -> tuple[float, float, dict]:
    """(wall s, 1-min load before, the profile written) of one `qsync-opt profile` run of the package under `code`."""
    work.mkdir(parents=True)
    out = work / "profile.json"
    env = {**os.environ, "PYTHONPATH": str(code), "QSYNC_OPT_PROFILE_DIR": str(work / "cache")}
    load = os.getloadavg()[0]
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "qsync_opt.cli", "profile", str(spec), "-o", str(out), "--quiet"],
                       cwd=code, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"error: profiling with {code} failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return wall, load, json.loads(out.read_text())


def op_costs(prof: dict) -> dict[tuple[str, str], float]:
    return {(k, sig): e["fwd_ms"] + e["bwd_ms"] for k, s in prof["sections"].items() for sig, e in s["ops"].items()}


def step_costs(prof: dict) -> dict[tuple[str, str, str], float]:
    return {(k, key, p): ms for k, s in prof["sections"].items() for key, per in s["steps"].items() for p, ms in per.items()}


def rel_diffs(a: dict, b: dict) -> list[float]:
    """|b − a| / a over the keys both hold (a > 0)."""
    return [abs(b[k] - a[k]) / a[k] for k in sorted(set(a) & set(b)) if a[k] > 0]


def spread(a: dict | None, b: dict) -> tuple[int, str, str, str, str]:
    """(ops compared, largest and median op difference, largest and median step difference); blanks without `a`."""
    if a is None:
        return 0, "", "", "", ""
    ops, steps = rel_diffs(op_costs(a), op_costs(b)), rel_diffs(step_costs(a), step_costs(b))

    def f(xs, fn):
        return f"{fn(xs):.3f}" if xs else ""

    return len(ops), f(ops, max), f(ops, statistics.median), f(steps, max), f(steps, statistics.median)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", default=str(ROOT / "examples" / "cpu_tiny.yaml"))
    ap.add_argument("--rounds", type=int, default=3, help="old/new pairs, alternating (at least 1)")
    ap.add_argument("--old", default=OLD, help="the commit to compare against (default %(default)s)")
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): 1 round, examples/cpu_tiny.yaml in fp32 only, the "
                         "estimator at its fewest calls")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: give at least 1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.smoke:
        from _smoke import rough_profiles, tiny_spec

        a.rounds = 1
        a.spec = str(tiny_spec(out / "smoke"))
        rough_profiles(out / "smoke" / "profiles")
    spec = Path(a.spec).resolve()
    if not spec.is_file():
        ap.error(f"--spec {a.spec}: no such file")
    shown = spec.relative_to(ROOT) if spec.is_relative_to(ROOT) else spec
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    new_rev = head.stdout.strip() or "?"

    rows, prev_old = [], None
    with tempfile.TemporaryDirectory() as d:
        old_code = export(a.old, Path(d) / "old")
        for r in range(1, a.rounds + 1):
            old_s, old_load, old = profile_once(old_code, spec, Path(d) / f"old{r}")
            new_s, new_load, new = profile_once(ROOT, spec, Path(d) / f"new{r}")
            n_ops, op_max, op_med, st_max, st_med = spread(old, new)
            _, noise_max, noise_med, noise_st_max, noise_st_med = spread(prev_old, old)
            rows.append({"round": r, "old_s": f"{old_s:.1f}", "new_s": f"{new_s:.1f}", "ratio": f"{old_s / new_s:.2f}",
                         "load_old": f"{old_load:.2f}", "load_new": f"{new_load:.2f}", "ops_compared": n_ops,
                         "op_max_rel_diff": op_max, "op_median_rel_diff": op_med,
                         "step_max_rel_diff": st_max, "step_median_rel_diff": st_med,
                         "noise_op_max_rel_diff": noise_max, "noise_op_median_rel_diff": noise_med,
                         "noise_step_max_rel_diff": noise_st_max, "noise_step_median_rel_diff": noise_st_med})
            print(f"round {r}: old {old_s:.1f} s, new {new_s:.1f} s (load {old_load:.2f} / {new_load:.2f})",
                  file=sys.stderr, flush=True)
            prev_old = old

    olds, news = [float(x["old_s"]) for x in rows], [float(x["new_s"]) for x in rows]
    header = [f"# PYTHONPATH=. python benchmarks/profile_speed.py --out {a.out} --spec {shown} --rounds {a.rounds} "
              f"--old {a.old}" + (" --smoke" if a.smoke else ""),
              f"# old {a.old}, new {new_rev}; CPU {cpu_model()}, {os.cpu_count()} cores; 1-min load before each run "
              f"in load_old/load_new, {'/'.join(f'{x:.2f}' for x in os.getloadavg())} at the end",
              f"# median wall: old {statistics.median(olds):.1f} s, new {statistics.median(news):.1f} s, "
              f"{statistics.median(olds) / statistics.median(news):.2f}x; relative differences are |new - old| / old "
              "of each op's fwd+bwd ms (whole steps: each precision's step) over those both profiles hold; noise_*: "
              "this round's old against the previous round's"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(out / "profile_speed.csv", "\n".join(header) + "\n" + buf.getvalue())

    print("\n".join(header))
    cols = ["round", "old_s", "new_s", "ratio", "load_old", "load_new", "ops_compared", "op_max_rel_diff",
            "op_median_rel_diff", "noise_op_max_rel_diff", "noise_op_median_rel_diff", "step_max_rel_diff",
            "noise_step_max_rel_diff"]
    widths = [max(len(c), *(len(str(x[c])) for x in rows)) for c in cols]
    print("  ".join(c.rjust(n) for c, n in zip(cols, widths)))
    for x in rows:
        print("  ".join(str(x[c]).rjust(n) for c, n in zip(cols, widths)))
    print(f"wrote {out / 'profile_speed.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
