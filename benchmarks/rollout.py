"""RL rollout policies side by side (Laminar): simulated at scale, and a real Ray run here vs the
calibrated simulator.

    python benchmarks/rollout.py --out DIR [--sim-steps 10] [--skip-real] [--real-rounds 3] [--real-steps N] [--eta 1]
    python benchmarks/rollout.py --out DIR --repack-only     # the repack decision timing alone
    python benchmarks/rollout.py --out DIR --real-only [--real-rounds 7]   # the real run alone (rollout_real.csv)
    python benchmarks/rollout.py --out DIR --real-only --trainer-micro-batches 4   # its trainer streaming
        # (rollout_real_streaming.csv, rollout_rounds_streaming.csv)

Simulated cases: a 7B-class policy (Qwen2.5-7B shape: 28 layers, GQA with 4 KV heads, 57,344 KV
bytes per token), response lengths lognormal with p99/median = 10, on 64 A100, 128 H100, and hybrid
fleets of A100 with L4 (8-bit) or T4 (4-bit), 16 H100 train; and verl's published 128-GPU split (64 H100 train,
64 rollout, 512 x 16 trajectories per step, see CASES); the 64-A100 fleet and verl's split again at AReaL's published
staleness bound η = 4 (its boba_grpo.yaml; --eta leaves these two at 4). Every policy variant runs on the same drawn
lengths; each case prints the two bounds on any policy's gain over the best other asynchronous one (one-step-off,
stale, partial-rollout, trajectory-async without repack, at the case's η): the trainer's (1 / its busy
share) and the rollouts' at that policy's decode rate (1 / the share of rollout time not idle, syncing or
re-prefilling). Real: examples/rollout_cpu_tiny.yaml (4 rollout actors and a trainer on this machine),
each variant measured in interleaved rounds (the machine's load drifts over minutes: it falls on every variant
alike), the median round reported with the rounds' range, then the simulator calibrated from every round's
timings predicts each one.

Writes DIR/rollout.csv (mode, case, policy, trajectories_per_s, tokens_per_s, rollout_idle_frac,
trainer_idle_frac, staleness_mean, ...; with --skip-real DIR/rollout_simulated.csv instead, so a simulated-only run
never stands in for the real one) and DIR/rollout_repack.csv (repack decision time for 64
workers and 2,000 in-flight trajectories, per backend: 30 calls at the 50 ms default, how many overran it), with the command and the machine load in
their headers.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_table import load_now, write_table  # noqa: E402
from qsync_opt.rollout.agreement import (
    discordant,
    kendall_tau_b,
    normalised_rounds,
    ordered_pairs,
    round_normalised,
)
from qsync_opt.rollout.repack import (
    RepackState,
    RepackTraj,
    RepackWorker,
    repack,
    warm_up,
)
from qsync_opt.rollout.simulate import VARIANTS, Simulator, simulate
from qsync_opt.rollout.spec import load_rollout_spec
from qsync_opt.solver.backends import EXACT, available

QWEN7B = {"layers": 28, "hidden": 3584, "ffn": 18944, "heads": 28, "kv_heads": 4, "vocab": 152064,
          "max_positions": 32768, "ffn_matrices": 3, "tied_embeddings": False, "learned_positions": False}
COLUMNS = ["mode", "case", "policy", "trajectories_per_s", "tokens_per_s", "rollout_idle_frac", "trainer_idle_frac",
           "staleness_mean", "staleness_max", "kv_util_mean", "repacks", "moves", "solver_ms_mean", "solver_ms_max",
           "steps", "time_s", "wall_s", "repack_clock_stops", "tail_extension_s", "rollout_reprefill_frac", "runs",
           "tps_min", "tps_max"]


FIXED_ETA: dict[str, int] = {}
"""Cases whose η is a published setting: --eta does not change it."""


def case(name, groups, workers, interconnect="infiniband-hdr", per_worker=32, median=1000, ratio=10.0, trainer=16,
         prompts=None, max_len=16384, batch_cap=64, eta=None):
    """A simulated case; `eta` fixes its staleness bound (a published setting), otherwise --eta sets it."""
    if eta is not None:
        FIXED_ETA[name] = eta
    n = sum(g["count"] for g in groups)
    return name, {
        "kind": "rollout", "name": name,
        "cluster": {"groups": [{"name": "trainer", "device": "H100-SXM", "count": trainer}] + groups,
                    "interconnect": interconnect},
        "rollout": {"trainer": "trainer", "workers": workers, "model": QWEN7B,
                    "workload": {"prompts_per_step": prompts or n * per_worker // 16, "group_size": 16,
                                 "prompt_len": 512, "response": {"median": median, "p99": median * ratio},
                                 "max_len": max_len},
                    "policy": {"kind": "trajectory-async", "eta": eta or 1},
                    "repack": {"method": "program", "kv_threshold": 0.9, "batch_cap": batch_cap, "interval_s": 2.0},
                    "solver": {"backend": "highs", "time_limit_s": 0.05}},
    }


CASES = [
    case("a100x64", [{"name": "a100", "device": "A100-80GB", "count": 64}], [{"group": "a100", "bits": 16}]),
    case("h100x128", [{"name": "h100", "device": "H100-SXM", "count": 128}], [{"group": "h100", "bits": 16}]),
    case("a100x64+l4x64", [{"name": "a100", "device": "A100-80GB", "count": 64},
                           {"name": "l4", "device": "L4", "count": 64}],
         [{"group": "a100", "bits": 16}, {"group": "l4", "bits": 8}], interconnect="ethernet-100g"),
    case("a100x128+t4x128", [{"name": "a100", "device": "A100-80GB", "count": 128},
                             {"name": "t4", "device": "T4", "count": 128}],
         [{"group": "a100", "bits": 16}, {"group": "t4", "bits": 4}], interconnect="ethernet-100g"),
    # A published disaggregated configuration rather than ours: verl's fully-async recipe
    # (recipe/fully_async_policy/README.md, the anchor ../shared/REFERENCES.md names for partial rollout) trains
    # Qwen2.5-Math-7B on 128 GPUs split 64 trainer : 64 rollout, 512 prompts x 16 responses per step,
    # max_response_length 28K; its rollout default max_num_seqs is 1024 (verl/trainer/config/rollout/rollout.yaml),
    # the decode-batch cap here. Its GPUs are H20 (not in the catalog): H100 here. The other cases give the trainer
    # 16 GPUs against 64-256 rollouts; this one has four times the trainer per rollout.
    case("h100x64-verl128", [{"name": "h100", "device": "H100-SXM", "count": 64}], [{"group": "h100", "bits": 16}],
         trainer=64, prompts=512, max_len=28672, batch_cap=1024),
    # The staleness bound an anchor system publishes for a long-response reasoning run, not one tuned here: AReaL's
    # math-reasoning example examples/math/boba_grpo.yaml (inclusionAI/AReaL, commit 00d07c04) sets
    # rollout.max_head_offpolicyness: 4, AReaL's η, which is the stale policy's admission rule here
    # ((η + version + 1)·batch); its GSM8K example (gsm8k_grpo.yaml, 1,024-token responses) sets 2. verl's
    # fully-async staleness_threshold (a fraction of a batch, 0.5 in its recipe) is below the spec's smallest η, 1,
    # and Laminar publishes none. η = 4 on the 64-A100 fleet and on verl's split, every asynchronous policy.
    case("a100x64-areal-eta4", [{"name": "a100", "device": "A100-80GB", "count": 64}], [{"group": "a100", "bits": 16}],
         eta=4),
    case("h100x64-verl128-areal-eta4", [{"name": "h100", "device": "H100-SXM", "count": 64}],
         [{"group": "h100", "bits": 16}], trainer=64, prompts=512, max_len=28672, batch_cap=1024, eta=4),
]


def case_caps(ap, items: list[str], one_kind: str | None = None) -> list[tuple[str, int]]:
    """`case:cap` arguments as (case, decode-batch cap); a bad one ends the program through `ap.error`, naming it.
    `one_kind`: refuse a case with more than one worker kind, for that reason."""
    known = dict(CASES)
    out = []
    for item in items:
        name, _, cap = item.partition(":")
        if name not in known or not cap.isdigit():
            ap.error(f"--cases: {item!r}: expected case:cap with a case of {', '.join(known)} and an integer cap")
        if one_kind and len(known[name]["rollout"]["workers"]) != 1:
            ap.error(f"--cases: {name} has more than one worker kind; {one_kind}")
        out.append((name, int(cap)))
    return out


def case_job(name: str, steps: int, eta: int = 1, interval_factor: float = 1.0):
    """The spec of case `name` for `steps` trainer steps, at its published η (FIXED_ETA) or else `eta`, its repack
    tick every `interval_factor` times its interval_s. Works on a copy: CASES stays as declared for the next caller."""
    d = copy.deepcopy(dict(CASES)[name])
    d["rollout"]["steps"] = steps
    d["rollout"]["policy"]["eta"] = FIXED_ETA.get(name, eta)
    if interval_factor != 1.0:
        d["rollout"]["repack"]["interval_s"] = round(d["rollout"]["repack"]["interval_s"] * interval_factor, 6)
    return load_rollout_spec(d)


ASYNC = ("one-step-off", "stale", "partial-rollout", "trajectory-async")
"""The asynchronous policies without repack: trajectory-async with repack is compared to the best of them."""


class GuardedBestFit(Simulator):
    """repack-best-fit under RepackState.tail_guard, as the simulator's program repacks (printed, not a variant)."""

    def _tail_guard(self) -> bool:
        return True


def row(mode, case_name, policy, r, time_s):
    return {"mode": mode, "case": case_name, "policy": policy, "trajectories_per_s": r.trajectories_per_s,
            "tokens_per_s": r.tokens_per_s, "rollout_idle_frac": r.rollout_idle_frac,
            "trainer_idle_frac": r.trainer_idle_frac, "staleness_mean": r.staleness_mean,
            "staleness_max": r.staleness_max, "kv_util_mean": getattr(r, "kv_util_mean", ""),
            "repacks": r.repacks, "moves": r.moves, "solver_ms_mean": getattr(r, "solver_wall_ms_mean", ""),
            "solver_ms_max": getattr(r, "solver_wall_ms_max", ""), "steps": r.steps, "time_s": time_s,
            "wall_s": r.wall_s, "repack_clock_stops": getattr(r, "repack_clock_stops", ""),
            "tail_extension_s": getattr(r, "tail_extension_s", ""),
            "rollout_reprefill_frac": getattr(r, "rollout_reprefill_frac", "")}


def fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else v


def repack_timing(reps: int = 30, reps_long: int = 3):
    """Every backend's repack decision on one 64-worker, 2,000-trajectory state, timed as the caller sees it (from the
    call to its return): `reps` calls at the 50 ms default limit (how many overran it, and by how much), first as the
    process stands, then after `warm_up(freeze=True)` (gc.freeze: the collection a decision's allocations trigger no
    longer rescans torch's objects), then `reps_long` at 1 s (what more time buys). The process is unfrozen after."""
    rng = random.Random(1)
    ws = [RepackWorker(f"w{i}", 400000, 64, rng.uniform(1e4, 2e4), rng.choice([0.01, 0.012])) for i in range(64)]
    ts = [RepackTraj(f"t{k}", f"w{rng.randrange(64)}", rng.randint(600, 8000), rng.randint(0, 6000))
          for k in range(2000)]
    out = []
    try:
        for frozen in (False, True):
            if frozen:
                warm_up("highs", freeze=True)
            for guard in (False, True):  # a fresh state per call: a state caches its caps and loads
                out += _timing(lambda g=guard: RepackState(ws, ts, 0.9, max_freed=None, tail_guard=g), reps,
                               reps_long if frozen else 0, frozen)
    finally:
        gc.unfreeze()
    return out


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (CBC runs as a subprocess): a decision's own work,
    which a loaded machine stretches in wall time but not in CPU time."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(reps, call):
    """The last of `reps` results, each call's decision seconds (`RepackResult.wall_s`), and its wall and CPU ms as
    the caller sees them (from the call to its return: the collection the decision's allocations trigger as the
    collector resumes is in it). A call over its limit with CPU well under its wall waited for a core (a loaded
    machine descheduled it); one with CPU over it did too much. Only the last result is kept, as a caller keeps its
    latest decision: holding all 30 (2,000 moves each) made every full collection rescan them."""
    r, decided_s, wall_ms, cpu_ms = None, [], [], []
    for _ in range(reps):
        r = None  # the previous decision is dropped before the next call, as a caller replaces it
        c0, t0 = _cpu_s(), time.perf_counter()
        r = call()
        wall_ms.append(1e3 * (time.perf_counter() - t0))
        cpu_ms.append(1e3 * (_cpu_s() - c0))
        decided_s.append(r.wall_s)
    return r, decided_s, wall_ms, cpu_ms


def _timing(make, reps, reps_long, frozen):
    out = []
    st = make()
    bf = _timed(reps, lambda: repack(make(), method="best-fit"))
    out.append(_timing_row(st, "best-fit", "", "", *bf, bf[0].objective, frozen))
    for be in [b for b in EXACT if available()[b]]:
        warm_up(be)  # the first call with a backend in a process imports it (repack.warm_up)
        for limit, n in ((0.05, reps), (1.0, reps_long)):
            if n:
                out.append(_timing_row(st, "program", be, limit,
                                       *_timed(n, lambda: repack(make(), backend=be, time_limit_s=limit)),
                                       bf[0].objective, frozen))
    return out


def _timing_row(st, method, backend, limit, r, decided_s, wall_ms, cpu_ms, base, frozen=False):
    over = [f"{w:.1f}/{c:.1f}" for w, c in zip(wall_ms, cpu_ms) if limit != "" and w > limit * 1e3]
    walls = sorted(wall_ms)
    return {"method": method, "tail_guard": st.tail_guard, "gc_frozen": frozen, "backend": backend,
            "limit_ms": "" if limit == "" else limit * 1e3, "calls": len(wall_ms),
            "median_ms": statistics.median(walls), "cpu_ms_median": statistics.median(cpu_ms), "max_ms": walls[-1],
            "over_limit": "" if limit == "" else len(over), "over_wall_cpu_ms": " ".join(over),
            "after_decision_ms_max": max(w - 1e3 * d for w, d in zip(wall_ms, decided_s)),
            "freed": len(r.freed), "objective": r.objective, "vs_best_fit": r.objective / base if base else "",
            "status": r.status, "gap": "" if r.gap is None else r.gap}


def simulated_cases(args) -> list[dict]:
    """The simulated rows: the 1,000-step timing case, then every case x variant, with the bounds printed."""
    rows = []

    # the 64-worker, 1,000-step case: how long the simulator takes
    long_steps = 10 if args.smoke else 1000
    name, d = case(f"a100x64-{long_steps}steps", [{"name": "a100", "device": "A100-80GB", "count": 64}],
                   [{"group": "a100", "bits": 16}], per_worker=4)
    d["rollout"]["steps"] = long_steps
    job = load_rollout_spec(d)
    r = simulate(job, "trajectory-async")
    rows.append(row("simulated", name, "trajectory-async", r, r.sim_time_s))
    print(f"{name}: trajectory-async, {job.rollout.workload.batch} trajectories/step, {long_steps} steps simulated in "
          f"{r.wall_s:.1f} s wall")

    for name, _ in CASES:
        if args.cases and name not in args.cases:
            continue
        job = case_job(name, args.sim_steps, args.eta)
        res = {}
        for v in VARIANTS:
            res[v] = simulate(job, v)
            rows.append(row("simulated", name, v, res[v], res[v].sim_time_s))
        sync = res["sync"].trajectories_per_s
        best_other = max(ASYNC, key=lambda v: res[v].trajectories_per_s)
        print(f"\n{name}: {job.rollout.workload.batch} trajectories/step, {args.sim_steps} steps, "
              f"η = {job.rollout.policy.eta}")
        for v in VARIANTS:
            x = res[v]
            print(f"  {v:17s} {x.trajectories_per_s:8.2f} traj/s  {x.trajectories_per_s / sync:5.2f}x sync  "
                  f"idle {x.rollout_idle_frac:5.1%}  trainer idle {x.trainer_idle_frac:5.1%}  "
                  f"stale {x.staleness_mean:.2f}/{x.staleness_max}  KV {x.kv_util_mean:5.1%}  "
                  f"repacks {x.repacks} ({x.solver_wall_ms_mean:.1f} ms mean)  [{x.wall_s:.1f} s]")
        # no policy can train faster than the trainer steps: over `best_other` at most 1 / (its trainer busy share)
        b = res[best_other]
        ceiling = 1 / max(1e-9, 1 - b.trainer_idle_frac)
        # nor, at the same per-worker decode rate, generate faster than `best_other`'s rollouts would if none of their
        # time went idle, to syncs or to re-prefills: beyond that only larger decode batches (throughput concave in B)
        waste = b.rollout_idle_frac + b.rollout_reprefill_frac
        gen_bound = 1 / max(1e-9, 1 - waste)
        share = 1 - res["sync"].trainer_idle_frac
        print(f"  sync: training {share:.0%} of the step, generation (+ sync) {1 - share:.0%} "
              f"(Laminar's math: generation 83%); {best_other}: trainer busy {1 - b.trainer_idle_frac:.0%}, rollouts "
              f"idle/syncing {b.rollout_idle_frac:.1%} + re-prefilling {b.rollout_reprefill_frac:.1%}")
        for v in ("repack-best-fit", "repack-program"):
            print(f"  {v}: {res[v].trajectories_per_s / sync:.2f}x sync, "
                  f"{res[v].trajectories_per_s / b.trajectories_per_s:.2f}x {best_other} "
                  f"(trainer-bound ceiling {ceiling:.2f}x; at {best_other}'s decode rate without its idle and "
                  f"re-prefill {gen_bound:.2f}x), "
                  f"{res[v].trajectories_per_s / res['trajectory-async'].trajectories_per_s:.3f}x trajectory-async")
        # like for like: the program repacks under the tail guard, best-fit (Laminar's, as published) without it
        g = GuardedBestFit(job, "repack-best-fit").run()
        print(f"  best-fit under the program's tail guard: {g.trajectories_per_s:.2f} traj/s; repack-program "
              f"{res['repack-program'].trajectories_per_s / g.trajectories_per_s - 1:+.2%} against it, "
              f"{res['repack-program'].trajectories_per_s / res['repack-best-fit'].trajectories_per_s - 1:+.2%} "
              f"against unguarded best-fit")

    return rows


def real_run(args, out: Path, argv, load0: float) -> list[dict]:
    """The real run here (Ray actors), measured against the simulator calibrated from it; writes out/rollout_rounds.csv
    (every round of every variant, for the paired ranking)."""
    rows = []
    import yaml

    from qsync_opt.rollout.ray_run import median_round, predict_calibrated, run_rounds

    d = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "rollout_cpu_tiny.yaml").read_text())
    if args.real_steps:
        d["rollout"]["steps"] = args.real_steps
    d["rollout"]["trainer_micro_batches"] = args.trainer_micro_batches
    job = load_rollout_spec(d)
    load0 = os.getloadavg()[0]
    real = run_rounds(job, args.real_rounds)
    pred, info = predict_calibrated(job, real)
    print(f"\nreal run ({job.name}: 4 rollout actors + trainer, {job.rollout.steps} steps, "
          f"{job.rollout.trainer_micro_batches} trainer micro-batch(es) a step, {args.real_rounds} "
          f"interleaved rounds, load {load0:.1f} -> {os.getloadavg()[0]:.1f}), calibration from every round: {info}")
    for v, rs in real.items():
        r = median_round(rs)
        tps = sorted(x.trajectories_per_s for x in rs)
        rows.append(row("real", job.name, v, r, r.wall_s) | {"runs": len(rs), "tps_min": tps[0], "tps_max": tps[-1]})
        p = pred[v]
        rows.append(row("predicted", job.name, v, p, p.sim_time_s))
        print(f"  {v:17s} real {r.trajectories_per_s:7.2f} traj/s (rounds {tps[0]:.1f}-{tps[-1]:.1f})  predicted "
              f"{p.trajectories_per_s:7.2f} ({p.trajectories_per_s / r.trajectories_per_s - 1:+.0%})  rollout idle "
              f"{r.rollout_idle_frac:.0%} / {p.rollout_idle_frac:.0%}  trainer idle {r.trainer_idle_frac:.0%} / "
              f"{p.trainer_idle_frac:.0%}  staleness {r.staleness_mean:.2f} / {p.staleness_mean:.2f}  "
              f"repacks {sum(x.repacks for x in rs)} / {p.repacks}")
    med = {v: median_round(rs).trajectories_per_s for v, rs in real.items()}
    print(f"  ranking real (medians):       {sorted(real, key=lambda v: -med[v])}\n"
          f"  ranking predicted:            {sorted(real, key=lambda v: -pred[v].trajectories_per_s)}")
    rounds = {v: [x.trajectories_per_s for x in rs] for v, rs in real.items()}
    predicted = {v: p.trajectories_per_s for v, p in pred.items()}
    norm = round_normalised(rounds)
    print(f"  ranking real (paired rounds): {sorted(real, key=lambda v: -norm[v])}; Kendall tau-b against the "
          f"prediction {kendall_tau_b(predicted, norm):.2f} (medians: {kendall_tau_b(predicted, med):.2f})")
    disc = discordant(predicted, rounds)
    for d in disc:
        print(f"  discordant: predicted {d.higher_predicted} {d.predicted_ratio:.3f}x {d.lower_predicted}, measured "
              f"{d.real_ratio:.3f}x round-normalised, ahead in {d.wins} of {d.rounds} rounds; per-round ratio's median "
              f"in {d.interval[0]:.3f}-{d.interval[1]:.3f}x ({d.confidence:.1%}, sign test): "
              + ("the real run orders them: a wrong prediction" if d.resolved else "the real run does not order them"))
    n_pairs = len(rounds) * (len(rounds) - 1) // 2
    n_ord, n_same = ordered_pairs(predicted, rounds)
    print(f"  pairs ordered oppositely: {len(disc)} of {n_pairs}, of them ordered by the real run: "
          f"{sum(d.resolved for d in disc)}; pairs the real run orders (sign-test interval of the per-round ratio "
          f"excludes 1): {n_ord}, predicted in the same order: {n_same}")
    per_round = normalised_rounds(rounds)
    write_table(out / f"rollout_rounds{_streamed(args)}.csv", "rollout.py", argv,
                ["round", "policy", "trajectories_per_s", "round_normalised", "repacks", "moves", "predicted"],
                [{"round": i + 1, "policy": v, "trajectories_per_s": fmt(rounds[v][i]),
                  "round_normalised": fmt(per_round[v][i]), "repacks": rs[i].repacks, "moves": rs[i].moves,
                  "predicted": fmt(predicted[v])}
                 for i in range(args.real_rounds) for v, rs in real.items()], load0)
    same = [v for v in ("repack-best-fit", "repack-program") if v in real and not any(x.repacks for x in real[v])]
    for v in same:  # no repack happened: the same schedule as trajectory-async, so their gap is the run's noise
        gaps = [abs(a.trajectories_per_s / b.trajectories_per_s - 1) for a, b in zip(real[v], real["trajectory-async"])]
        print(f"  {v} made no repack: it ran trajectory-async's schedule; per round it measured "
              f"{', '.join(f'{g:.0%}' for g in gaps)} away from trajectory-async (the real run's own noise)")
    return rows


def _streamed(args) -> str:
    """The real run's tables' suffix: its trainer streaming or not."""
    return "_streaming" if args.trainer_micro_batches > 1 else ""


def write_repack_timing(out: Path, argv, load0: float, smoke: bool = False) -> Path:
    timing = repack_timing(2, 1) if smoke else repack_timing()
    print("\nrepack decision, 64 workers x 2,000 in-flight trajectories:")
    for t in timing:
        over = "" if t["over_limit"] == "" else f", {t['over_limit']} of {t['calls']} over the limit"
        over += f" (wall/CPU ms: {t['over_wall_cpu_ms']})" if t["over_wall_cpu_ms"] else ""
        print(f"  {t['method']:8s} {'guard ' if t['tail_guard'] else '      '}{'frozen ' if t['gc_frozen'] else '       '}"
              f"{t['backend']:6s} limit {t['limit_ms']!s:>6} ms: "
              f"median {t['median_ms']:6.1f} ms, max {t['max_ms']:6.1f} ms{over}, CPU {t['cpu_ms_median']:6.1f} ms, "
              f"returned <= {t['after_decision_ms_max']:.1f} ms after deciding, "
              f"freed {t['freed']}, objective {t['objective']:.0f} "
              f"({t['vs_best_fit'] if t['vs_best_fit'] == '' else format(t['vs_best_fit'], '.3f')}x best-fit), "
              f"{t['status']}, gap {t['gap'] if t['gap'] == '' else format(t['gap'], '.1e')}")
    return write_table(out / "rollout_repack.csv", "rollout.py", argv, list(timing[0]),
                       [{k: fmt(v) for k, v in t.items()} for t in timing], load0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sim-steps", type=int, default=10)
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--real-rounds", type=int, default=3,
                    help="interleaved rounds of the real run (each variant once per round); the median round is reported")
    ap.add_argument("--real-steps", type=int, default=None, help="trainer steps of the real run (default: the spec's)")
    ap.add_argument("--cases", nargs="*", default=None, help="subset of case names")
    ap.add_argument("--eta", type=int, default=1, help="staleness bound η of every asynchronous policy (simulated cases)")
    ap.add_argument("--real-only", action="store_true",
                    help="only the real run against its calibrated prediction (rollout_real.csv, rollout_rounds.csv): "
                         "to repeat it without the simulated cases")
    ap.add_argument("--repack-only", action="store_true",
                    help="only the repack decision timing (rollout_repack.csv), no simulation and no real run")
    ap.add_argument("--trainer-micro-batches", type=int, default=1,
                    help="the real run's trainer computes each step over this many micro-batches "
                         "(rollout.trainer_micro_batches; with --real-only only: its own tables, *_streaming.csv)")
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): the timing case at 10 steps, case a100x64 at 1 step, the "
                         "real run 1 round of 1 step, the repack timing 2 calls (1 at 1 s)")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.smoke:
        args.cases, args.sim_steps, args.real_rounds, args.real_steps = ["a100x64"], 1, 1, 1
        # Ray kills its workers when the whole machine nears its memory limit, whoever uses it: a smoke run's few
        # tiny actors are never the cause, so its memory monitor is off (before Ray starts)
        os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    load0 = load_now()
    if args.real_only and (args.skip_real or args.repack_only):
        ap.error("--real-only runs only the real run: it excludes --skip-real and --repack-only")
    if args.trainer_micro_batches != 1 and not args.real_only:
        ap.error(f"--trainer-micro-batches {args.trainer_micro_batches}: only with --real-only (the simulated cases "
                 "stream their trainer in benchmarks/rollout_ceilings.py --trainer-micro-batches)")
    if args.trainer_micro_batches < 1:
        ap.error(f"--trainer-micro-batches {args.trainer_micro_batches}: at least 1 (1: whole batches)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.repack_only:
        if args.real_only:
            rows, table = real_run(args, out, argv, load0), out / f"rollout_real{_streamed(args)}.csv"
        else:
            rows = simulated_cases(args) + ([] if args.skip_real else real_run(args, out, argv, load0))
            table = out / ("rollout_simulated.csv" if args.skip_real else "rollout.csv")
        write_table(table, "rollout.py", argv, COLUMNS, [{k: fmt(v) for k, v in r.items()} for r in rows], load0)
        print(f"\nwrote {table}")
    if not args.real_only:
        print(f"wrote {write_repack_timing(out, argv, load0, args.smoke)}")


if __name__ == "__main__":
    main()
