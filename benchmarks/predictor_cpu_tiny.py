"""`qsync-opt run examples/cpu_tiny.yaml` end to end: wall time, profiling time, predicted vs trained.

    PYTHONPATH=. python benchmarks/predictor_cpu_tiny.py --out benchmarks/results/cpu_tiny_predict_vs_train.csv \
        [--tree DIR --label NAME] [--repeat N]

Per repeat, from a fresh, private profile cache (so the profile stage really measures):
`qsync-opt run SPEC -o D` (timed: the issue's "under 2 minutes including first-use
profiling"), then a second training window of the same plan (`qsync-opt train --plan
D/plan.json`). Measured iteration: per step the slowest rank's step_ms, first step left
out; reported as the median (what `run`'s report quotes) and as the median of block
minima (blocks of 5 steps: the profiler's own estimator). The in-run noise floor is the
relative difference between the two windows' medians; the error of the prediction is
given against each window. `--tree` runs another checkout of the project (e.g. the commit
before a change, for a before/after) with this spec; rows are appended to the CSV, each
with the machine load before and after, since on a shared machine the load moves every
figure.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def lockstep_steps(metrics: Path) -> list[float]:
    """Per step, the slowest rank's step_ms; the first step left out."""
    from qsync_opt.training.run_stages import lockstep_step_ms

    per = lockstep_step_ms(metrics)
    return [per[s] for s in sorted(per)[1:]]


def block_min_median(xs: list[float], block: int = 5) -> float:
    mins = sorted(min(xs[i:i + block]) for i in range(0, len(xs) - block + 1, block))
    return mins[len(mins) // 2]


def one(tree: Path, spec: str, steps: int, tmp: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "QSYNC_OPT_PROFILE_DIR": str(tmp / "cache")}
    env.pop("QSYNC_OPT_CACHE", None)
    out = tmp / "out"
    l0 = load()
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "qsync_opt.cli", "run", spec, "-o", str(out), "--steps", str(steps)],
                       env=env, capture_output=True, text=True, cwd=tree)
    wall = time.perf_counter() - t
    if r.returncode:
        raise RuntimeError(f"run failed ({r.returncode}): {r.stderr[-2000:]}")
    l1 = load()
    r2 = subprocess.run([sys.executable, "-m", "qsync_opt.cli", "train", spec, "--plan", str(out / "plan.json"),
                         "--steps", str(steps), "--metrics-dir", str(tmp / "train2")],
                        env=env, capture_output=True, text=True, cwd=tree)
    if r2.returncode:
        raise RuntimeError(f"train failed ({r2.returncode}): {r2.stderr[-2000:]}")
    w1, w2 = lockstep_steps(out / "train"), lockstep_steps(tmp / "train2")
    pred = json.loads((out / "predict.json").read_text())["iteration_ms"]
    m1, m2 = statistics.median(w1), statistics.median(w2)
    return {"run_wall_s": round(wall, 1), "profile_s": json.loads((out / "profile.json").read_text())["wall_s"],
            "predicted_ms": round(pred, 1), "train1_median_ms": round(m1, 1), "train2_median_ms": round(m2, 1),
            "train1_blockmin_ms": round(block_min_median(w1), 1), "train2_blockmin_ms": round(block_min_median(w2), 1),
            "noise_floor_pct": round(abs(m1 - m2) / ((m1 + m2) / 2) * 100, 1),
            "err1_pct": round((pred - m1) / m1 * 100, 1), "err2_pct": round((pred - m2) / m2 * 100, 1),
            "load_before": l0, "load_after_run": l1, "load_after": load()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="the .csv the rows are appended to, or a folder for its "
                    "cpu_tiny_predict_vs_train.csv (default: benchmarks/results/cpu_tiny_predict_vs_train.csv)")
    ap.add_argument("--tree", default=str(ROOT), help="project checkout to run (default: this one)")
    ap.add_argument("--label", default="this tree")
    ap.add_argument("--spec", default=str(ROOT / "examples" / "cpu_tiny.yaml"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): examples/cpu_tiny.yaml in fp32 only, 6 steps per "
                         "window (one 5-step block), the profiler at its fewest calls; needs --out")
    a = ap.parse_args(argv)
    if a.smoke and a.out is None:
        ap.error("--smoke needs --out: a smoke run never writes benchmarks/results")
    out = Path(a.out or Path(__file__).resolve().parent / "results" / "cpu_tiny_predict_vs_train.csv")
    if out.is_dir() or out.suffix != ".csv":  # a folder
        out = out / "cpu_tiny_predict_vs_train.csv"
    if a.smoke:  # each run profiles into its own temporary cache (one); tiny_spec makes the folder
        from _smoke import PROFILE_ENV, tiny_spec

        a.steps = 6
        a.spec = str(tiny_spec(out.parent / "smoke"))
        os.environ.update(PROFILE_ENV)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory() as d:
            row = {"label": a.label, **one(Path(a.tree), a.spec, a.steps, Path(d))}
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    new = not out.exists()
    with out.open("a", newline="") as f:
        if new:
            f.write("# PYTHONPATH=. python benchmarks/predictor_cpu_tiny.py [--tree DIR --label NAME]; 2 cores shared; "
                    "measured = slowest rank per step, first step dropped; noise floor = |window1 - window2| / mean\n")
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
