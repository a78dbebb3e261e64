"""How long one simulation of a rollout case takes: the 50-step A100 + T4 fleet (benchmarks/rollout.py's
a100x128+t4x128) under each repack variant, one process, with the machine's load beside each run.

The simulator is deterministic (rollout.sim_repack gives the program a work budget, not a clock), so the figures
(trajectories/s, repacks, moves) are the same on any machine; only the wall time depends on the machine and its
load. The program's exact solves are where a hybrid fleet's simulation spent its time (docs/rollout.md, "How long
a simulation takes"); the column `solver_s` is their share.

    PYTHONPATH=. python benchmarks/rollout_sim_time.py --out DIR [--case a100x128+t4x128] [--sim-steps 50]
        [--variants repack-program repack-best-fit] [--seed 0]

Writes DIR/rollout_sim_time.csv (case, steps, seed, variant, wall_s, solver_s, load_before, load_after,
trajectories_per_s, repacks, moves, repack_clock_stops).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_table import load_now, write_table  # noqa: E402
from benchmarks.rollout import case_job  # noqa: E402
from qsync_opt.rollout.simulate import Simulator  # noqa: E402

COLS = ("case", "steps", "seed", "variant", "wall_s", "solver_s", "load_before", "load_after", "trajectories_per_s",
        "repacks", "moves", "repack_clock_stops")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", default="a100x128+t4x128")
    ap.add_argument("--sim-steps", type=int, default=50)
    ap.add_argument("--variants", nargs="+", default=["repack-program", "repack-best-fit"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="smallest end-to-end run (tests): 2 trainer steps")
    args = ap.parse_args(argv)
    if args.smoke:
        args.sim_steps = 2
    argv = sys.argv[1:] if argv is None else list(argv)
    load0 = load_now()
    rows = []
    for v in args.variants:
        job = case_job(args.case, args.sim_steps)
        before = os.getloadavg()[0]
        t0 = time.perf_counter()
        r = Simulator(job, v, seed=args.seed).run()
        wall = time.perf_counter() - t0
        after = os.getloadavg()[0]
        solver_s = r.solver_wall_ms_mean * r.repacks / 1e3
        rows.append({"case": args.case, "steps": args.sim_steps, "seed": args.seed, "variant": v,
                     "wall_s": f"{wall:.1f}", "solver_s": f"{solver_s:.1f}", "load_before": f"{before:.2f}",
                     "load_after": f"{after:.2f}", "trajectories_per_s": f"{r.trajectories_per_s:.4f}",
                     "repacks": r.repacks, "moves": r.moves, "repack_clock_stops": r.repack_clock_stops})
        print(f"{args.case}, {args.sim_steps} steps, seed {args.seed}, {v}: {wall:.1f} s wall ({solver_s:.1f} s in "
              f"repack decisions), load {before:.2f} -> {after:.2f} on {os.cpu_count()} CPUs; "
              f"{r.trajectories_per_s:.2f} traj/s, {r.repacks} repacks, {r.moves} moves", flush=True)
    path = write_table(Path(args.out) / "rollout_sim_time.csv", "rollout_sim_time.py", argv, COLS, rows, load0)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
