"""The program's repack against best-fit over workload seeds: how much of "program ≥ best-fit" is one draw.

benchmarks/rollout.py simulates each case on the spec's seed. Here the same cases are simulated with repack-best-fit
and repack-program on several workload seeds (the response lengths drawn, `Simulator(..., seed=s)`), and the table
gives program − best-fit in trajectories/s per seed. Deterministic; the program's solves are exact in the simulator,
so a hybrid fleet takes tens of seconds per seed.

    PYTHONPATH=. python benchmarks/rollout_seeds.py --out DIR [--cases a100x64+l4x64] [--seeds 5] [--first-seed 0]
        [--sim-steps 10]

Ten steps is the policy table's horizon (benchmarks/rollout.py); it favoured the program by chance: at 50 steps, on the
same seeds, the program lost 0.19-0.41% on 64 A100 until its packing followed best-fit's order (2026-12-03). Compare at
50 steps; a hybrid fleet's program then takes about ten minutes per seed (its exact full-form solves).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_table import load_now, write_table  # noqa: E402
from benchmarks.rollout import CASES, case_job  # noqa: E402
from qsync_opt.rollout.simulate import Simulator  # noqa: E402

COLS = ("case", "seed", "steps", "best_fit_tps", "program_tps", "program_vs_best_fit_pct", "program_solver_ms_max")
TIE_PCT = 0.1
"""|program − best-fit| below this (percent of best-fit) is printed as a tie: seeds move either by ±0.2% alone."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="*", default=["a100x64+l4x64"], help="case names of benchmarks/rollout.py")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--sim-steps", type=int, default=10)
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): case a100x64, 1 seed, 1 trainer step")
    args = ap.parse_args(argv)
    if args.smoke:
        args.cases, args.seeds, args.first_seed, args.sim_steps = ["a100x64"], 1, 0, 1
    load0 = load_now()
    known = dict(CASES)
    if unknown := [c for c in args.cases if c not in known]:
        ap.error(f"--cases: {', '.join(unknown)} unknown; choose from {', '.join(known)}")
    rows = []
    for name in args.cases:
        job = case_job(name, args.sim_steps)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            bf = Simulator(job, "repack-best-fit", seed=seed).run()
            pr = Simulator(job, "repack-program", seed=seed).run()
            gain = 100 * (pr.trajectories_per_s / bf.trajectories_per_s - 1)
            rows.append({"case": name, "seed": seed, "steps": args.sim_steps, "best_fit_tps": round(bf.trajectories_per_s, 3),
                         "program_tps": round(pr.trajectories_per_s, 3), "program_vs_best_fit_pct": round(gain, 2),
                         "program_solver_ms_max": round(pr.solver_wall_ms_max)})
            print(f"{name} seed {seed}: best-fit {bf.trajectories_per_s:.3f}, program {pr.trajectories_per_s:.3f} "
                  f"traj/s ({gain:+.2f}%)", flush=True)
    print(f"\nprogram vs best-fit over {args.seeds} seeds from {args.first_seed} at {args.sim_steps} trainer steps (a tie: within {TIE_PCT}%)")
    for name in args.cases:
        g = [r["program_vs_best_fit_pct"] for r in rows if r["case"] == name]
        wins, ties = sum(x >= TIE_PCT for x in g), sum(abs(x) < TIE_PCT for x in g)
        print(f"  {name:28s} mean {sum(g) / len(g):+.2f}%  range {min(g):+.2f} .. {max(g):+.2f}%  "
              f"gains {wins}, ties {ties}, losses {len(g) - wins - ties}")
    path = write_table(Path(args.out) / "rollout_seeds.csv", "rollout_seeds.py",
                       argv if argv is not None else sys.argv[1:], COLS, rows, load0)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
