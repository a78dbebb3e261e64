"""How far each rollout policy is from what any policy could reach: the proven ceilings of rollout.bounds and
rollout.bounds_staleness.

For every case of benchmarks/rollout.py (the same specs, workload seed, η and steps as its simulated rows), the
long-run ceiling under the staleness rule (rollout.bounds_staleness.staleness_ceiling: the trainer's steps back to
back; the rollouts' hardware with every decode step priced at the plane under its cost; and the rule, admitted ≤
(η + version + 1) batches, through its admission gate and its room, each token's work and latency tied through its
decode batch), beside the one without the rule
(rollout.bounds.ceiling), then every policy simulated with the ceiling of its own run (the trajectories it trained
and could admit, under the rule). The column that bears on #22's "≥ 1.3× the best other asynchronous policy": the
ceiling over the best of one-step-off, stale, partial-rollout and trajectory-async without repack, the most any
policy can gain over it in the long run. Each streaming policy's mean use of the rule's room is printed beside it,
split by where its trajectories are (decoding, finished and waiting for their step, in training, queued), how much
slower they decoded than the least latency the gate prices (SimResult.latency_stretch), and what the run would make
at that least latency with its room as full (SimResult.at_least_latency_tps: a what-if, not a bound); then the
trainer's busy share, the mean decode batch of a busy rollout and its tokens' slowdown per step
(SimResult.decode_stretch_mean). With --choose-cap each case's batch cap is also chosen as the planner does under
rollout.repack.choose_cap (rollout.admission.choose_cap, under repack-best-fit when it is simulated, else
trajectory-async), then each slower kind's own cap (rollout.admission.choose_kind_caps); where either moves,
every policy is simulated again at the chosen caps, its ceilings at them (rows with that batch_cap and kind_caps).

With --trainer-micro-batches M > 1 every case's trainer streams (rollout.trainer_micro_batches = M: each step's
micro-batches computed as its trajectories finish), every policy and ceiling for that trainer.

    PYTHONPATH=. python benchmarks/rollout_ceilings.py --out DIR [--cases ...] [--sim-steps 50] [--variants ...]
        [--jobs 1] [--choose-cap] [--trainer-micro-batches 1]

Writes DIR/rollout_ceilings.csv (DIR/rollout_ceilings_streaming.csv with more than one micro-batch). Deterministic
(figures do not depend on the machine or its load).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_table import load_now, write_table  # noqa: E402
from benchmarks.rollout import ASYNC, CASES, case_job  # noqa: E402
from qsync_opt.rollout.admission import choose_cap, choose_kind_caps, with_cap, with_kind_cap  # noqa: E402
from qsync_opt.rollout.bounds_staleness import staleness_ceiling  # noqa: E402
from qsync_opt.rollout.simulate import VARIANTS, simulate  # noqa: E402

COLS = ("case", "eta", "steps", "trainer_micro_batches", "batch_cap", "kind_caps", "policy",
        "trajectories_per_s", "run_ceiling_tps", "of_run_ceiling",
        "ceiling_tps", "ceiling_without_rule_tps", "ceiling_trainer_tps", "ceiling_rollout_tps", "ceiling_rule_tps",
        "ceiling_room_tps", "ceiling_gate_tps", "bound_by", "of_ceiling", "of_ceiling_without_rule", "gate_fill_mean",
        "gate_waiting_mean", "room_decoding_mean", "room_training_mean", "room_queued_mean", "latency_stretch",
        "wait_s_mean", "at_least_latency_tps",
        "trainer_idle_frac", "rollout_idle_frac", "decode_batch_mean", "decode_stretch_mean")
ROOM = ("gate_fill_mean", "gate_waiting_mean", "room_decoding_mean", "room_training_mean", "room_queued_mean",
        "latency_stretch", "wait_s_mean")
"""SimResult fields of the rule's room (None for the barrier policies)."""


def _job(name, steps, eta, caps=None, micro_batches=1):
    """The case at `caps` = (fleet cap, ((group, its own cap), ...)) or, None, at its spec's; its trainer computes a
    step over `micro_batches`."""
    job = case_job(name, steps, eta)
    if micro_batches != 1:
        streamed = job.rollout.model_copy(update={"trainer_micro_batches": micro_batches})
        job = job.model_copy(update={"rollout": streamed})
    if caps is None:
        return job
    job = with_cap(job, caps[0])
    for g, c in caps[1]:
        job = with_kind_cap(job, g, c)
    return job


def _run(task):
    name, steps, eta, variant, cap, mb = task
    r = simulate(_job(name, steps, eta, cap, mb), variant)
    return task, (r.trajectories_per_s, r.ceiling_tps, {k: getattr(r, k) for k in ROOM}, r.at_least_latency_tps(),
                  r.trainer_idle_frac, r.rollout_idle_frac, r.decode_batch_mean, r.decode_stretch_mean)


def _simulate_all(tasks, jobs):
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as ex:
            return list(ex.map(_run, tasks))
    return [_run(t) for t in tasks]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="*", default=[name for name, _ in CASES],
                    help="case names of benchmarks/rollout.py (default: all seven)")
    ap.add_argument("--sim-steps", type=int, default=50,
                    help="trainer steps (10 steps flatter the policies that leave long trajectories in flight)")
    ap.add_argument("--eta", type=int, default=1, help="as benchmarks/rollout.py's --eta (published η cases keep theirs)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS,
                    help="policies simulated (default: all; sync and the asynchronous ones are always run)")
    ap.add_argument("--jobs", type=int, default=1, help="simulations run at once, one process each")
    ap.add_argument("--choose-cap", action="store_true",
                    help="also choose each case's batch cap as the planner does (rollout.admission) and, where it "
                         "moves, simulate every policy again at it")
    ap.add_argument("--trainer-micro-batches", type=int, default=1,
                    help="micro-batches the trainer computes each step over (rollout.trainer_micro_batches; 1: whole "
                         "batches)")
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): case h100x128, every variant, 1 trainer step")
    args = ap.parse_args(argv)
    if args.smoke:
        args.cases, args.sim_steps = ["h100x128"], 1
    known = dict(CASES)
    if unknown := [c for c in args.cases if c not in known]:
        ap.error(f"--cases: {', '.join(unknown)} unknown; choose from {', '.join(known)}")
    mb = args.trainer_micro_batches
    if mb < 1:
        ap.error(f"--trainer-micro-batches {mb}: at least 1 (1: the trainer takes whole batches)")
    load0 = load_now()
    variants = [v for v in VARIANTS if v in set(args.variants) | {"sync", *ASYNC}]
    tasks = [(c, args.sim_steps, args.eta, v, None, mb) for c in args.cases for v in variants]
    done = _simulate_all(tasks, args.jobs)
    runs = [(c, None) for c in args.cases]
    if args.choose_cap:
        under = "repack-best-fit" if "repack-best-fit" in variants else "trajectory-async"
        for c in args.cases:
            base = _job(c, args.sim_steps, args.eta, micro_batches=mb)
            choice = choose_cap(base, under)
            _, kinds = choose_kind_caps(with_cap(base, choice.cap), under)
            print(f"{c}: {choice.line()}" + "".join(f"; {k.line()}" for k in kinds))
            if choice.changed or any(k.changed for k in kinds):
                caps = (choice.cap, tuple((k.group, k.cap) for k in kinds if k.changed))
                extra = [(c, args.sim_steps, args.eta, v, caps, mb) for v in variants]
                done += _simulate_all(extra, args.jobs)
                runs.insert(runs.index((c, None)) + 1, (c, caps))
    got = {(task[0], task[3], task[4]): figs for task, figs in done}
    rows = []
    trainer = "whole batches" if mb == 1 else f"{mb} micro-batches a step, streamed"
    print(f"proven ceilings (rollout.bounds_staleness), {args.sim_steps} trainer steps, workload seed of each spec, "
          f"trainer: {trainer}")
    for c, cap_run in runs:
        job = _job(c, args.sim_steps, args.eta, cap_run, mb)
        cap = job.rollout.repack.batch_cap
        kind_caps = " ".join(f"{w.group}:{w.batch_cap}" for w in job.rollout.workers if w.batch_cap is not None)
        cl = staleness_ceiling(job)
        old = cl.base
        eta = cl.eta
        best = max(ASYNC, key=lambda v: got[(c, v, cap_run)][0])
        b = got[(c, best, cap_run)][0]
        repacked = [v for v in ("repack-best-fit", "repack-program") if v in variants]
        print(f"\n{c} (η = {eta}, batch cap {cap}{', ' + kind_caps if kind_caps else ''}): ceiling {cl.tps:.2f} traj/s, bound by the {cl.bound_by} (trainer "
              f"{old.trainer_tps:.2f}, rollouts' hardware {old.rollout_tps:.2f}, staleness rule {cl.rule_tps:.2f}: its room "
              f"{cl.room_tps or float('nan'):.2f}, its gate {cl.gate_tps:.2f}); "
              f"without the rule {old.tps:.2f}" + (f" ({cl.note})" if cl.note else ""))
        for v in variants:
            tps, run_c, room, what_if, t_idle, r_idle, batch, stretch = got[(c, v, cap_run)]
            fill = room["gate_fill_mean"]
            gate = "" if fill is None else (
                f"\n    staleness room {fill:6.1%} in use: decoding {room['room_decoding_mean']:5.1%}, finished and "
                f"waiting {room['gate_waiting_mean']:5.1%} ({room['wait_s_mean']:.1f} s each), in training "
                f"{room['room_training_mean']:5.1%}, queued {room['room_queued_mean']:5.1%}; latency "
                f"{room['latency_stretch']:.2f}x the least; at the least latency (what-if) {what_if:.2f} traj/s, "
                f"{what_if / cl.tps:.1%} of the ceiling")
            print(f"  {v:17s} {tps:8.2f} traj/s  {tps / run_c:6.1%} of its run's ceiling ({run_c:.2f})  "
                  f"{tps / cl.tps:6.1%} of the long-run one  trainer busy {1 - t_idle:5.1%}  rollouts idle "
                  f"{r_idle:5.1%}  decode batch {batch:6.1f}, tokens {stretch:4.2f}x the single-sequence step{gate}")
            rows.append({"case": c, "eta": eta, "steps": args.sim_steps, "trainer_micro_batches": mb,
                         "batch_cap": cap, "kind_caps": kind_caps, "policy": v,
                         "trajectories_per_s": round(tps, 3), "run_ceiling_tps": round(run_c, 3),
                         "of_run_ceiling": round(tps / run_c, 4), "ceiling_tps": round(cl.tps, 3),
                         "ceiling_without_rule_tps": round(old.tps, 3), "ceiling_trainer_tps": round(old.trainer_tps, 3),
                         "ceiling_rollout_tps": round(old.rollout_tps, 3), "ceiling_rule_tps": round(cl.rule_tps, 3),
                         "ceiling_room_tps": "" if cl.room_tps is None else round(cl.room_tps, 3),
                         "ceiling_gate_tps": round(cl.gate_tps, 3),
                         "bound_by": cl.bound_by, "of_ceiling": round(tps / cl.tps, 4),
                         "of_ceiling_without_rule": round(tps / old.tps, 4),
                         **{k: "" if x is None else round(x, 4) for k, x in room.items()},
                         "at_least_latency_tps": "" if what_if is None else round(what_if, 3),
                         "trainer_idle_frac": round(t_idle, 4), "rollout_idle_frac": round(r_idle, 4),
                         "decode_batch_mean": round(batch, 2), "decode_stretch_mean": round(stretch, 4)})
        top = max(variants, key=lambda v: got[(c, v, cap_run)][0])
        top_tps = got[(c, top, cap_run)][0]
        print(f"  best policy: {top} {top_tps:.2f}, {top_tps / cl.tps:.1%} of the ceiling "
              f"({top_tps / old.tps:.1%} of the one without the rule)")
        verdict = "rules out 1.3x" if cl.tps / b < 1.3 else "leaves room for 1.3x"
        print(f"  best other asynchronous: {best} {b:.2f}; the ceiling is {cl.tps / b:.2f}x it ({verdict}); "
              + ", ".join(f"{v} {got[(c, v, cap_run)][0] / b:.2f}x it" for v in repacked))
    name = "rollout_ceilings.csv" if mb == 1 else "rollout_ceilings_streaming.csv"
    path = write_table(Path(args.out) / name, "rollout_ceilings.py",
                       argv if argv is not None else sys.argv[1:], COLS, rows, load0)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
