"""How long `qsync-opt solve` takes on a rollout spec: every policy variant simulated in this process (processes=1)
against the first here and the rest in worker processes (`rollout.plan.simulate_variants`, processes = the CPUs this
process may use), alternated `--reps` times in one run so that both see the same machine. Checks that both give the
same figures (wall times aside), prints a table and writes `rollout_plan_time.csv`.

    PYTHONPATH=. python benchmarks/rollout_plan_time.py --out DIR [--spec examples/rollout_laminar.yaml] [--reps 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_table import write_table  # noqa: E402
from qsync_opt.jobs import load_spec  # noqa: E402
from qsync_opt.rollout.plan import simulate_variants  # noqa: E402

COLS = ("spec", "mode", "processes", "runs", "wall_s_median", "wall_s_runs", "vs_serial", "same_figures")


def _figures(results: dict) -> dict:
    return {v: r.simulated() for v, r in results.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", default="examples/rollout_laminar.yaml")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): examples/rollout_cpu_tiny.yaml, each mode once")
    args = ap.parse_args(argv)
    if args.smoke:
        args.spec, args.reps = str(Path(__file__).resolve().parents[1] / "examples" / "rollout_cpu_tiny.yaml"), 1
    job = load_spec(args.spec)
    n = len(os.sched_getaffinity(0))
    load0 = os.getloadavg()
    walls = {1: [], n: []}
    figs = {}
    for _ in range(args.reps):
        for procs in (1, n):  # alternated: both modes see the same stretch of the machine's load
            t0 = time.perf_counter()
            res = simulate_variants(job, processes=procs)
            walls[procs].append(time.perf_counter() - t0)
            figs.setdefault(procs, _figures(res))
            print(f"processes={procs}: {walls[procs][-1]:.1f} s", flush=True)
    same = figs[1] == figs[n]
    serial = statistics.median(walls[1])
    rows = [{"spec": args.spec, "mode": "serial" if p == 1 else "workers", "processes": p, "runs": len(w),
             "wall_s_median": round(statistics.median(w), 2), "wall_s_runs": " ".join(f"{x:.2f}" for x in w),
             "vs_serial": round(statistics.median(w) / serial, 3), "same_figures": same} for p, w in walls.items()]
    load1 = os.getloadavg()
    print(f"\n{args.spec}: {len(figs[1])} variants, load {load0[0]:.2f} -> {load1[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'mode':<8} {'processes':>9} {'median s':>9} {'runs s':>16} {'vs serial':>9}")
    for r in rows:
        print(f"{r['mode']:<8} {r['processes']:>9} {r['wall_s_median']:>9.2f} {r['wall_s_runs']:>16} {r['vs_serial']:>9.3f}")
    print(f"same figures in both modes: {same}")
    path = write_table(Path(args.out) / "rollout_plan_time.csv", "rollout_plan_time.py",
                       argv if argv is not None else sys.argv[1:], COLS, rows, load0[0])
    print(f"wrote {path}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
