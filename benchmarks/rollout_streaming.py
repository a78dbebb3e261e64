"""The streaming trainer (rollout.trainer_micro_batches) against the whole-batch one, per streaming policy.

A whole-batch trainer starts a step once a whole batch of trajectories has finished. A streaming one computes the
step's forward and backward micro-batch by micro-batch as trajectories finish (gradients accumulated: the same
gradient) and only the last micro-batch and the optimizer step wait for the batch; each micro-batch is priced at its
own tokens and starts once it is in and the trainer is free (rollout.sim_policies). The staleness rule is unchanged
(a batch counts as trained at its step's end). Each run is set against the proven ceiling of its own trajectories
for its trainer (rollout.bounds_staleness.staleness_run_ceiling: the gate ends step k no sooner than the least its
last micro-batch can take after the k·batch-th finish, and a trajectory stays in the room at least that long).

    PYTHONPATH=. python benchmarks/rollout_streaming.py --out DIR [--cases a100x64:48 ...] [--sim-steps 50]
        [--micro-batches 8] [--variants partial-rollout repack-best-fit] [--smoke]

Writes DIR/rollout_streaming.csv. Deterministic (figures do not depend on the machine or its load).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_table import load_now, write_table  # noqa: E402
from benchmarks.rollout import case_caps, case_job  # noqa: E402
from qsync_opt.rollout.admission import with_cap  # noqa: E402
from qsync_opt.rollout.sim_records import VARIANTS  # noqa: E402
from qsync_opt.rollout.simulate import Simulator  # noqa: E402

COLS = ("case", "batch_cap", "steps", "micro_batches", "policy", "batch_trainer_tps", "streaming_tps",
        "streaming_over_batch", "batch_run_ceiling_tps", "streaming_run_ceiling_tps", "batch_of_ceiling", "streaming_of_ceiling",
        "batch_trainer_idle_frac", "streaming_trainer_idle_frac")
STREAMING = ("stale", "partial-rollout", "trajectory-async", "repack-best-fit", "repack-program")


def streaming(job, micro_batches: int):
    """The job with its trainer computing each step over `micro_batches` (rollout.trainer_micro_batches)."""
    return job.model_copy(update={"rollout": job.rollout.model_copy(update={"trainer_micro_batches": micro_batches})})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="*", default=["a100x64:48", "h100x128:64", "h100x64-verl128:192"],
                    help="case:cap of benchmarks/rollout.py (default: the one-kind η = 1 cases at the caps the "
                         "planner chooses)")
    ap.add_argument("--sim-steps", type=int, default=50, help="trainer steps simulated")
    ap.add_argument("--micro-batches", type=int, default=8, help="micro-batches per trainer step")
    ap.add_argument("--variants", nargs="*", default=["partial-rollout", "repack-best-fit"], choices=STREAMING,
                    help="streaming policies simulated with both trainers")
    ap.add_argument("--smoke", action="store_true", help="smallest end-to-end run (tests): h100x128:64, 1 step")
    args = ap.parse_args(argv)
    if args.smoke:
        args.cases, args.sim_steps = ["h100x128:64"], 1
    if args.micro_batches < 1:
        ap.error(f"--micro-batches {args.micro_batches}: at least 1 (1 is the whole-batch trainer)")
    cases = case_caps(ap, args.cases)
    load0 = load_now()
    rows = []
    print(f"whole-batch trainer against a streaming one ({args.micro_batches} micro-batches a step), "
          f"{args.sim_steps} steps, traj/s")
    for name, cap in cases:
        job = with_cap(case_job(name, args.sim_steps), cap)
        for v in [v for v in VARIANTS if v in args.variants]:
            a = Simulator(job, v).run()
            b = Simulator(streaming(job, args.micro_batches), v).run()
            ratio = b.trajectories_per_s / a.trajectories_per_s
            rows.append({"case": name, "batch_cap": cap, "steps": args.sim_steps, "micro_batches": args.micro_batches,
                         "policy": v, "batch_trainer_tps": round(a.trajectories_per_s, 3),
                         "streaming_tps": round(b.trajectories_per_s, 3), "streaming_over_batch": round(ratio, 4),
                         "batch_run_ceiling_tps": round(a.ceiling_tps, 3),
                         "streaming_run_ceiling_tps": round(b.ceiling_tps, 3),
                         "batch_of_ceiling": round(a.trajectories_per_s / a.ceiling_tps, 4),
                         "streaming_of_ceiling": round(b.trajectories_per_s / b.ceiling_tps, 4),
                         "batch_trainer_idle_frac": round(a.trainer_idle_frac, 4),
                         "streaming_trainer_idle_frac": round(b.trainer_idle_frac, 4)})
            print(f"  {name:18s} cap {cap:4d}  {v:17s} {a.trajectories_per_s:8.2f} -> {b.trajectories_per_s:8.2f} "
                  f"({ratio:.3f}x)  of its run's ceiling {a.trajectories_per_s / a.ceiling_tps:6.1%} -> "
                  f"{b.trajectories_per_s / b.ceiling_tps:6.1%} ({a.ceiling_tps:.2f} -> {b.ceiling_tps:.2f})  "
                  f"trainer idle {a.trainer_idle_frac:5.1%} -> {b.trainer_idle_frac:5.1%}")
    path = write_table(Path(args.out) / "rollout_streaming.csv", "rollout_streaming.py",
                       argv if argv is not None else sys.argv[1:], COLS, rows, load0)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
