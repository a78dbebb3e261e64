"""How far a simulated run moves when nothing that matters changes: the resolution of "program vs best-fit".

A repack plan changes which trajectories sit where for the rest of the run, so one tick's choice moves a whole
run's throughput by a few tenths of a percent either way. To tell a method's gain from that, each case and workload
seed is simulated with the same repack method five times, the repack tick every 0.98, 0.99, 1.00, 1.01 and 1.02
times the spec's `interval_s` (2.00 s: 1.96 ... 2.04 s). A shift of the tick by 20-40 ms should not make a method better
or worse in expectation, so how far the five runs lie apart (max − min, per seed) is the run-to-run resolution of the
simulator there; the widest of a case's seeds is its band. The program's margin over best-fit (`rollout_seeds.csv`,
same cases, seeds and steps) is a gain or a loss only outside the case's band.

    PYTHONPATH=. python benchmarks/rollout_resolution.py --out DIR [--cases ...] [--seeds 5] [--sim-steps 50]
        [--methods best-fit] [--jobs 1]

Prints a table per case and, where `DIR/rollout_seeds.csv` has the same case, seed and steps, the program's margin
beside the band; writes `rollout_resolution.csv`. Deterministic (figures do not depend on the machine or its load).
"""

from __future__ import annotations

import argparse
import csv
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_table import load_now, write_table  # noqa: E402
from benchmarks.rollout import CASES, case_job  # noqa: E402
from qsync_opt.rollout.simulate import Simulator  # noqa: E402

FACTORS = (0.98, 0.99, 1.0, 1.01, 1.02)
"""Repack tick intervals simulated, as multiples of the case's interval_s."""
COLS = ("case", "seed", "steps", "method", "interval_s", "trajectories_per_s", "vs_base_pct")


def _run(task):
    name, seed, steps, method, factor = task
    job = case_job(name, steps, interval_factor=factor)
    r = Simulator(job, f"repack-{method}", seed=seed).run()
    return task, job.rollout.repack.interval_s, r.trajectories_per_s


def spread_pct(tps: list[float], base: float) -> float:
    """Width of the band the runs span, in percent of the base run's throughput."""
    return 100 * (max(tps) - min(tps)) / base


def classify(margin_pct: float, band_pct: float) -> str:
    """A program margin over best-fit is a gain or a loss only outside the band the method spans against itself."""
    if margin_pct > band_pct:
        return "gain"
    if margin_pct < -band_pct:
        return "loss"
    return "tie"


def _seeds_margins(path: Path, steps: int) -> dict[tuple[str, int], float]:
    """(case, seed) -> program − best-fit in percent, from a rollout_seeds.csv of the same horizon."""
    if not path.exists():
        return {}
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    out = {}
    for r in csv.DictReader(lines):
        if int(r["steps"]) == steps:
            out[(r["case"], int(r["seed"]))] = float(r["program_vs_best_fit_pct"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="*", default=[name for name, _ in CASES],
                    help="case names of benchmarks/rollout.py (default: all seven)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--sim-steps", type=int, default=50)
    ap.add_argument("--methods", nargs="*", default=["best-fit"], choices=["best-fit", "program"])
    ap.add_argument("--jobs", type=int, default=1, help="simulations run at once, one process each")
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): case a100x64, 1 seed, 2 trainer steps, best-fit")
    args = ap.parse_args(argv)
    if args.smoke:
        args.cases, args.seeds, args.sim_steps, args.methods = ["a100x64"], 1, 2, ["best-fit"]
    known = dict(CASES)
    if unknown := [c for c in args.cases if c not in known]:
        ap.error(f"--cases: {', '.join(unknown)} unknown; choose from {', '.join(known)}")
    tasks = [(c, s, args.sim_steps, m, f) for c in args.cases for s in range(args.seeds) for m in args.methods
             for f in FACTORS]
    load0 = load_now()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as ex:
            done = list(ex.map(_run, tasks))
    else:
        done = [_run(t) for t in tasks]
    tps = {task: (interval, v) for task, interval, v in done}
    rows = []
    for (c, s, steps, m, f), (interval, v) in tps.items():
        base = tps[(c, s, steps, m, 1.0)][1]
        rows.append({"case": c, "seed": s, "steps": steps, "method": m, "interval_s": interval,
                     "trajectories_per_s": round(v, 3), "vs_base_pct": round(100 * (v / base - 1), 3)})
    out = Path(args.out)
    margins = _seeds_margins(out / "rollout_seeds.csv", args.sim_steps)
    print(f"the same method with its repack tick up to 2% earlier / later, {args.seeds} seeds at {args.sim_steps} "
          f"trainer steps: max − min of the {len(FACTORS)} runs per seed, % of the base run; the band: the widest")
    for c in args.cases:
        for m in args.methods:
            bands = []
            for s in range(args.seeds):
                runs = [tps[(c, s, args.sim_steps, m, f)][1] for f in FACTORS]
                bands.append(spread_pct(runs, tps[(c, s, args.sim_steps, m, 1.0)][1]))
            band = max(bands)
            line = f"  {c:28s} {m:9s} band {band:.2f}% (seeds: {', '.join(f'{b:.2f}' for b in bands)})"
            got = [(s, margins[(c, s)]) for s in range(args.seeds) if (c, s) in margins]
            if m == "best-fit" and got:
                kinds = [classify(g, band) for _, g in got]
                line += (f"; program − best-fit {', '.join(f'{g:+.2f}' for _, g in got)}: gains {kinds.count('gain')}, "
                         f"ties {kinds.count('tie')}, losses {kinds.count('loss')}")
            print(line)
    path = write_table(out / "rollout_resolution.csv", "rollout_resolution.py",
                       argv if argv is not None else sys.argv[1:], COLS, rows, load0)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
