"""The real run: Ray actors as rollout workers and trainer, weights through Ray's object store.

Each rollout actor holds a small random-weight decoder (torch) with a real KV cache per slot; it
prefills admitted prompts (or, for a migrated or interrupted trajectory, its prompt + response so
far: re-prefill) and decodes its batch step by step; a trajectory stops at its length drawn from the
workload (random weights never emit an end token). The trainer actor takes finished trajectories,
does a real AdamW step (policy-gradient-weighted next-token loss) and publishes each version once
with `ray.put` — the object store is the relay tier: a rollout pulls a version by fetching that
object. The driver applies the same policy rules as the simulator (rollout.simulate), with the
same drawn lengths. Every decode step, prefill, trainer step and weight pull is timed; `calibrate`
fits the simulator's costs to them, so the simulator can be checked against the run.

A rollout actor that dies mid-run (killed, crashed) is dropped: its in-flight trajectories go back
to the queue and are generated again from their prompts; none is lost or trained twice.
"""

from __future__ import annotations

from qsync_opt.errors import SpecError
from qsync_opt.rollout.actors import RolloutActor, TrainerActor, build_model, model_dict, need_ray
from qsync_opt.rollout.calibrate import CalibratedCosts, calibrate
from qsync_opt.rollout.costs import model_params
from qsync_opt.rollout.driver import MAX_STEPS_PER_CALL, Driver, RunResult
from qsync_opt.rollout.driver_repack import REPREFILL_STEPS_PER_TOKEN
from qsync_opt.rollout.simulate import VARIANTS, simulate

__all__ = [
    "MAX_STEPS_PER_CALL",
    "REPREFILL_STEPS_PER_TOKEN",
    "CalibratedCosts",
    "Driver",
    "RolloutActor",
    "RunResult",
    "TrainerActor",
    "build_model",
    "calibrate",
    "check_runs_here",
    "make_actors",
    "measured_vs_predicted",
    "median_round",
    "model_dict",
    "need_ray",
    "run",
    "run_rounds",
    "start_ray",
]



def start_ray(num_cpus: int = 2):
    ray = need_ray()
    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return ray


def make_actors(job, seed: int = 0):
    """One rollout actor per rollout device of the job, and the trainer; all start from the same weights."""
    ray = need_ray()
    cfg = model_dict(job)
    n = job.rollout_devices
    R = ray.remote(num_cpus=0, max_restarts=0)(RolloutActor)
    T = ray.remote(num_cpus=0)(TrainerActor)
    actors = [R.remote(i, cfg, job.rollout.repack.batch_cap, seed) for i in range(n)]
    w = job.rollout.workload
    trainer = T.remote(cfg, seed, reward_ref=w.response.mean(w.max_len))
    ray.get([a.ping.remote() for a in actors])
    return actors, trainer


def run(job, out_dir=None, variants=None, kill_after_steps: int | None = None, seed: int = 0) -> dict:
    """Run each variant for real (the same actors, reset between variants); returns variant -> RunResult
    with the timing logs (for `calibrate`), and writes out_dir/run.csv when out_dir is given."""
    out = {v: rs[0] for v, rs in run_rounds(job, 1, variants, kill_after_steps, seed).items()}
    if out_dir is not None:
        _write_results(out, out_dir)
    return out


def _available_bytes() -> float | None:
    """MemAvailable of this machine (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_runs_here(job, available_bytes: float | None = None) -> None:
    """Refuse, before Ray starts, a real run whose models do not fit this machine's memory: every rollout actor builds
    the spec's model in fp32 on this CPU, and the trainer holds it with its gradients and AdamW's two moments, and
    the object store a published version or two: about (actors + 6) x 4 bytes per parameter. The Laminar example's
    8B model on 64 actors would need some 2 TiB."""
    n = job.rollout_devices
    params = model_params(job.rollout.model)
    need = (n + 6) * 4.0 * params
    avail = _available_bytes() if available_bytes is None else available_bytes
    if avail is not None and need > 0.8 * avail:
        raise SpecError(
            f"rollout.model: the real run builds {job.rollout.model.label} ({params / 1e9:.2f} B parameters) in fp32 on "
            f"this CPU for each of {n} rollout actors and the trainer, about {need / 2**30:.1f} GiB, against "
            f"{avail / 2**30:.1f} GiB available; run a small model here (as examples/rollout_cpu_tiny.yaml does) and "
            f"plan the large one with `qsync-opt solve`")


def run_rounds(job, rounds: int, variants=None, kill_after_steps: int | None = None, seed: int = 0) -> dict:
    """`rounds` runs of every variant, interleaved (round 1 runs each variant once, then round 2, ...), so that
    the load of a shared machine, which drifts over minutes, falls on every variant alike; returns
    variant -> [RunResult per round] (the same drawn lengths and seed in every round)."""
    check_runs_here(job)
    ray = start_ray()
    out: dict = {}
    actors, trainer = make_actors(job, seed)
    for _ in range(rounds):
        for v in variants or VARIANTS:
            ray.get([a.reset.remote(seed) for a in actors] + [trainer.reset.remote(seed)])
            d = Driver(job, v, actors, trainer, kill_after_steps=kill_after_steps, seed=seed)
            res = d.run()
            logs = {"rollout": [], "calls": d.call_log, "broadcast": d.bcast_log, "pull": d.pull_log,
                    "train": d.train_log, "interrupt": d.interrupt_log, "driver_cpu_s": d.driver_cpu_s, "span": (d.t_start, d.t_end)}
            for i in sorted(d.alive):
                try:
                    logs["rollout"].append(ray.get(actors[i].logs.remote()))
                except ray.exceptions.RayActorError:
                    pass
            res.logs = logs
            out.setdefault(v, []).append(res)
            if d.lost:  # a killed actor is not reused: start the next variant on a fresh set
                for a in actors:
                    ray.kill(a)
                ray.kill(trainer)
                actors, trainer = make_actors(job, seed)
    for a in actors:
        ray.kill(a)
    ray.kill(trainer)
    return out


def median_round(runs: list):
    """The median of one variant's rounds by trajectories/s (the upper one of an even count): the round a real run
    reports for that variant."""
    return sorted(runs, key=lambda x: x.trajectories_per_s)[len(runs) // 2]


def predict_calibrated(job, real: dict) -> tuple[dict, object]:
    """The simulator calibrated from every round of `real` (variant -> measured runs, as run_rounds returns): each
    variant's prediction under the fitted costs, and the calibration's summary."""
    costs, sync_c, train_s, info = calibrate(job, real)
    return {v: simulate(job, v, costs=costs, sync=sync_c, train_s=train_s) for v in real}, info


def measured_vs_predicted(job, rounds: int = 1, variants=None, seed: int = 0,
                          per_round: dict | None = None) -> tuple[list[dict], str]:
    """Run every variant for real `rounds` times (interleaved, `run_rounds`), fit the simulator's costs to all of
    it (`calibrate`) and simulate each variant with them; returns one row per variant (the median round's measured
    figures beside the calibrated prediction) and the calibration's summary. `per_round`, if a dict, receives
    variant -> every round's measured trajectories/s, in round order."""
    real = run_rounds(job, rounds, variants, seed=seed)
    if per_round is not None:
        per_round.update({v: [r.trajectories_per_s for r in rs] for v, rs in real.items()})
    pred, info = predict_calibrated(job, real)
    rows = []
    for v, rs in real.items():
        r = median_round(rs)
        p = pred[v]
        rows.append({"policy": v, "rounds": len(rs), "real_trajectories_per_s": r.trajectories_per_s,
                     "predicted_trajectories_per_s": p.trajectories_per_s,
                     "predicted_vs_real": p.trajectories_per_s / r.trajectories_per_s - 1,
                     "real_rollout_idle_frac": r.rollout_idle_frac, "predicted_rollout_idle_frac": p.rollout_idle_frac,
                     "real_trainer_idle_frac": r.trainer_idle_frac, "predicted_trainer_idle_frac": p.trainer_idle_frac,
                     "real_staleness_mean": r.staleness_mean, "predicted_staleness_mean": p.staleness_mean,
                     "real_repacks": r.repacks, "predicted_repacks": p.repacks, "lost_actors": len(r.lost_actors)})
    return rows, str(info)


def _write_results(results: dict, out_dir) -> None:
    """out_dir/run.csv: one row per variant (the measured columns of RunResult)."""
    import csv
    from pathlib import Path

    p = Path(out_dir)
    p.mkdir(parents=True, exist_ok=True)
    cols = ["variant", "steps", "wall_s", "trajectories_per_s", "tokens_per_s", "rollout_idle_frac",
            "trainer_idle_frac", "staleness_mean", "staleness_max", "repacks", "moves", "lost_actors"]
    with open(p / "run.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in results.values():
            w.writerow([getattr(r, c) for c in cols])
