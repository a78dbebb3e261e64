"""The rollout plan: every policy simulated under the same costs, one recommended (its report: rollout.run_report).

`solve(job)` simulates each variant (sync, one-step-off, stale, partial-rollout, trajectory-async,
and trajectory-async with best-fit and program repack) and recommends one (`recommend`): the simplest
variant, in that order, within TIE_FRAC of the highest trajectories/s. The figures are predictions of
the simulator under the serving cost model (or calibrated costs), not measurements.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from qsync_opt.rollout.bounds import ceiling
from qsync_opt.rollout.costs import all_worker_costs, sync_costs
from qsync_opt.rollout.simulate import VARIANTS, SimResult, simulate

PLAN_VERSION = 1

log = logging.getLogger(__name__)
"""Progress of `simulate_variants` at INFO, one line per policy simulated: `qsync-opt solve` and `run` print it on
stderr; a library caller sees it only if it configures logging."""

TIE_FRAC = 0.01
"""Variants within this fraction of the fastest count as tied with it. The simulator is deterministic, but a margin
this small is not resolved by one run: one repack method moved by up to 0.93% against itself when only its repack
tick moved by up to 2% (`benchmarks/rollout_resolution.py`, 7 cases x 5 workload seeds at 50 trainer steps), and
repack-program against repack-best-fit moved from -0.29% to +0.44% over those seeds (docs/rollout.md)."""


def recommend(results) -> tuple[str, str]:
    """The variant to recommend among `results` (SimResults, or anything with `variant`, `trajectories_per_s`,
    `staleness_mean`) and why: of the variants within TIE_FRAC of the fastest, the first in VARIANTS order, i.e.
    the one with fewer moving parts (sync before any asynchrony, no repack before best-fit before the program).
    Outside a tie, the fastest; its reason gives its margin over the next."""
    rs = sorted(results, key=lambda x: -x.trajectories_per_s)
    fastest = rs[0]
    tied = [x for x in rs if x.trajectories_per_s >= (1 - TIE_FRAC) * fastest.trajectories_per_s]
    order = {v: i for i, v in enumerate(VARIANTS)}
    best = min(tied, key=lambda x: order.get(x.variant, len(order)))
    reason = f"{best.trajectories_per_s:.2f} trajectories/s"
    staleness = f"mean staleness {best.staleness_mean:.2f} (max {best.staleness_max})"
    if best is not fastest:
        return best.variant, (
            reason + f"; {fastest.variant} is within {TIE_FRAC:.0%} ({fastest.trajectories_per_s:.2f}, "
            f"+{fastest.trajectories_per_s / best.trajectories_per_s - 1:.2%}), a tie at the simulator's resolution, "
            f"so the simpler policy is recommended; {staleness}")
    if len(rs) > 1:
        runner = rs[1]  # best is the fastest, rs[0]
        reason += (f", {best.trajectories_per_s / runner.trajectories_per_s:.2f}x the next best ({runner.variant}); "
                   f"{staleness}")
    return best.variant, reason


class PolicyFigures(BaseModel):
    model_config = ConfigDict(frozen=True)
    variant: str
    trajectories_per_s: float
    tokens_per_s: float
    rollout_idle_frac: float
    rollout_sync_frac: float
    rollout_migrate_frac: float
    trainer_idle_frac: float
    staleness_mean: float
    staleness_max: int
    kv_util_mean: float
    repacks: int
    moves: int
    repack_overhead_s: float
    solver_wall_ms_mean: float
    solver_wall_ms_max: float
    sim_time_s: float
    steps: int
    ceiling_tps: float | None = None
    """The proven ceiling of this policy's run (SimResult.ceiling_tps): no schedule of the trajectories it trained
    is faster under these costs."""

    @classmethod
    def of(cls, r: SimResult) -> PolicyFigures:
        return cls(**{k: v for k, v in r.row().items() if k in cls.model_fields})


class WorkerSummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    group: str
    device: str
    bits: int
    count: int
    kv_capacity_tokens: float
    decode_ms_at_cap: float
    """One decode step at the batch cap, each sequence at the workload's mean context."""
    prefill_ms: float
    """Prefill of one prompt of the workload's mean length."""
    pull_s: float


class CeilingFigures(BaseModel):
    """rollout.bounds.ceiling: what no policy trains faster than, in the long run, under these costs."""

    model_config = ConfigDict(frozen=True)
    trajectories_per_s: float
    trainer_tps: float
    """The trainer's steps back to back."""
    rollout_tps: float
    """The rollouts' hardware, every decode step priced at the plane under its cost (no admission rule)."""
    bound_by: str

    @classmethod
    def of(cls, c) -> CeilingFigures:
        return cls(trajectories_per_s=c.tps, trainer_tps=c.trainer_tps, rollout_tps=c.rollout_tps,
                   bound_by=c.bound_by)


class RolloutPlan(BaseModel):
    model_config = ConfigDict(frozen=True)
    version: int = PLAN_VERSION
    name: str
    model: str
    batch: int
    """Trajectories per trainer step."""
    recommended: str
    reason: str
    spec_policy: str
    policies: list[PolicyFigures]
    workers: list[WorkerSummary]
    broadcast_s: float
    push_s: float
    steps: int
    notes: list[str] = []
    ceiling: CeilingFigures | None = None

    def figures(self, variant: str) -> PolicyFigures:
        return next(p for p in self.policies if p.variant == variant)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(self.to_json())
        return p


WORKER_MODULE = "qsync_opt.rollout.sim_worker"
"""What `simulate_variants` runs as `python -m` for a worker process."""

PARALLEL_AFTER_S = 0.5
"""`simulate_variants` runs the rest in worker processes when its first variant took at least this long: a worker
pays about 1.5 s importing the package (the CLI's Laminar example: 39 s of simulation over 7 variants)."""


def simulate_variants(job, variants=VARIANTS, processes: int | None = None, **kw) -> dict[str, SimResult]:
    """`simulate(job, v, **kw)` for every v in `variants`, in that order. The simulator is deterministic, so the
    variants are independent: the first runs here, and when it took PARALLEL_AFTER_S or more the others run in up
    to `processes` worker processes at once (default: the CPUs this process may use), the repack variants first.
    Results are those of the serial loop, value for value (wall times aside: the simulator's and its solver's are
    measured, not simulated).

    A worker is `python -m qsync_opt.rollout.sim_worker` fed by pipe, not a multiprocessing child: spawning one
    re-imports the caller's `__main__`, which re-runs a script that calls `qsync_opt.solve` without a main guard;
    a worker that fails leaves its variant to this process, which raises what it raises."""
    variants = list(variants)
    if not variants:
        return {}
    steps = kw.get("steps") or job.rollout.steps
    log.info("simulating %d policies of %s for %d trainer steps", len(variants), job.name, steps)
    t0 = time.perf_counter()
    out = {variants[0]: simulate(job, variants[0], **kw)}
    _done(variants[0], out[variants[0]])
    rest = variants[1:]
    n = processes if processes is not None else len(os.sched_getaffinity(0))
    if n < 2 or len(rest) < 2 or time.perf_counter() - t0 < PARALLEL_AFTER_S:
        for v in rest:
            out[v] = simulate(job, v, **kw)
            _done(v, out[v])
        return out
    log.info("the other %d in %d worker processes, the repack policies first", len(rest), min(n, len(rest)))
    import queue
    import threading

    todo: queue.Queue = queue.Queue()
    for v in reversed(rest):  # the repack variants, the slowest, first
        todo.put(v)
    done: dict[str, SimResult | None] = {}
    threads = [threading.Thread(target=_worker_loop, args=(job, kw, todo, done), daemon=True)
               for _ in range(min(n, len(rest)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for v in rest:
        if done.get(v) is None:
            done[v] = simulate(job, v, **kw)
            _done(v, done[v])
        out[v] = done[v]
    return out


def _done(variant: str, r: SimResult) -> None:
    """Log one policy simulated: its throughput and the wall time its simulation took here."""
    log.info("  %-17s %8.2f traj/s  simulated in %.1f s", variant, r.trajectories_per_s, r.wall_s)


def _worker_loop(job, kw: dict, todo, done: dict) -> None:
    """Feed one worker process (`qsync_opt.rollout.sim_worker`) variants from `todo` until it is empty; a variant
    the worker fails on is left out of `done` (the caller then runs it itself), and the worker is not used again."""
    import pickle
    import queue
    import subprocess
    import sys

    from qsync_opt.rollout.sim_worker import read_msg, write_msg

    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the package this process runs, not another install
    env["PYTHONPATH"] = os.pathsep.join([root, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else root
    try:
        p = subprocess.Popen([sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    except OSError:
        return
    try:
        while True:
            try:
                v = todo.get_nowait()
            except queue.Empty:
                break
            write_msg(p.stdin, pickle.dumps((job, v, kw)))
            msg = read_msg(p.stdout)
            if msg is None:
                break  # the worker died: this variant runs in the caller, the rest of the queue in other workers
            done[v] = pickle.loads(msg)
            _done(v, done[v])
    except Exception:  # noqa: BLE001 - a job that does not pickle, a worker that died: the caller runs what is left
        pass
    finally:
        try:
            p.stdin.close()  # end of input: the worker exits
        except OSError:
            pass
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def solve(job, steps: int | None = None, variants=VARIANTS, keep_results: dict | None = None,
          processes: int | None = None) -> RolloutPlan:
    """Simulate every policy variant of `job` and recommend one. `keep_results`, if a dict, receives
    variant -> SimResult (without timelines: `run_report` keeps those). `processes`: as for `simulate_variants`
    (1: everything in this process, no worker started)."""
    results = simulate_variants(job, variants, processes=processes, steps=steps, timeline_until=None)
    if keep_results is not None:
        keep_results.update(results)
    return plan_from(job, results, steps)


CUT_NOTE_FRAC = 0.01
"""A plan notes max_len when it cuts more than this share of the responses (more than a p99 tail)."""


def plan_from(job, results: dict[str, SimResult], steps: int | None = None) -> RolloutPlan:
    """The plan of `job` from its simulated variants (`simulate_variants`)."""
    from qsync_opt.rollout.simulate import _variant_of

    r = job.rollout
    recommended, reason = recommend(results.values())
    w = r.workload
    mean_prompt = w.prompt_len if isinstance(w.prompt_len, int) else w.prompt_len.mean(10**9)
    mean_ctx = mean_prompt + w.response.mean(w.max_len) / 2
    sc = sync_costs(job)
    workers = [WorkerSummary(group=c.group, device=c.device, bits=c.bits, count=c.count,
                             kv_capacity_tokens=c.kv_capacity_tokens,
                             decode_ms_at_cap=c.decode_ms(r.repack.batch_cap, r.repack.batch_cap * mean_ctx),
                             prefill_ms=c.prefill_ms(1, mean_prompt), pull_s=c.pull_s) for c in all_worker_costs(job)]
    notes = ["figures are simulator predictions under the serving cost model (rollout.costs), "
             "with a perfect length predictor for KV reservation and repack"]
    cut = w.response.cut_frac(w.max_len)
    if cut > CUT_NOTE_FRAC:
        shape = (f"the lengths file {w.response.file}" if w.response.file is not None else
                 f"median {w.response.median:g}" + (f", p99 {w.response.p99:g}" if w.response.p99 else ""))
        notes.append(f"rollout.workload.max_len {w.max_len} cuts {cut:.1%} of the responses ({shape}): they end at "
                     f"{w.max_len} tokens in every figure here; raise max_len if the policy is meant to finish them")
    return RolloutPlan(name=job.name, model=r.model.label, batch=w.batch, recommended=recommended, reason=reason,
                       spec_policy=_variant_of(job), policies=[PolicyFigures.of(x) for x in results.values()],
                       workers=workers, broadcast_s=sc.broadcast_s, push_s=sc.push_s,
                       steps=steps or r.steps, notes=notes, ceiling=CeilingFigures.of(ceiling(job, steps=steps)))


def print_plan(plan: RolloutPlan, console) -> None:
    """The plan as two rich tables: the workers' costs, and every policy side by side."""
    from rich.table import Table

    t = Table(title=f"{plan.name}: {plan.model}, {plan.batch} trajectories per trainer step, {plan.steps} steps",
              title_justify="left")
    for col in ("group", "device", "bits", "count", "KV tokens", "decode ms @cap", "prefill ms", "pull s"):
        t.add_column(col, justify="left" if col in ("group", "device") else "right")
    for w in plan.workers:
        t.add_row(w.group, w.device, str(w.bits), str(w.count), f"{w.kv_capacity_tokens:,.0f}",
                  f"{w.decode_ms_at_cap:.1f}", f"{w.prefill_ms:.1f}", f"{w.pull_s:.2f}")
    console.print(t)
    console.print(f"weight sync: global broadcast {plan.broadcast_s:.2f} s (all stall), relay push {plan.push_s:.2f} s "
                  "(trainer only)")
    if plan.ceiling:
        c = plan.ceiling
        console.print(f"ceiling (proven, any policy, long run): {c.trajectories_per_s:.2f} traj/s, bound by the "
                      f"{c.bound_by} (trainer {c.trainer_tps:.2f}, rollouts' hardware {c.rollout_tps:.2f})")
    p = Table(title="policies (simulated, same costs)", title_justify="left")
    for col in ("policy", "traj/s", "tokens/s", "× sync", "of ceiling", "rollout idle", "trainer idle",
                "staleness mean/max", "KV util", "repacks", "moves", "solver ms (mean/max)"):
        p.add_column(col, justify="left" if col == "policy" else "right")
    sync = next((x for x in plan.policies if x.variant == "sync"), None)
    for x in plan.policies:
        mark = " ◀" if x.variant == plan.recommended else ""
        p.add_row(x.variant + mark, f"{x.trajectories_per_s:.2f}", f"{x.tokens_per_s:,.0f}",
                  f"{x.trajectories_per_s / sync.trajectories_per_s:.2f}" if sync else "",
                  f"{x.trajectories_per_s / x.ceiling_tps:.0%}" if x.ceiling_tps else "",
                  f"{x.rollout_idle_frac:.1%}", f"{x.trainer_idle_frac:.1%}",
                  f"{x.staleness_mean:.2f}/{x.staleness_max}", f"{x.kv_util_mean:.1%}", str(x.repacks), str(x.moves),
                  f"{x.solver_wall_ms_mean:.1f}/{x.solver_wall_ms_max:.1f}" if x.repacks else "")
    console.print(p)
    console.print(f"recommended: {plan.recommended} — {plan.reason}")
    for n in plan.notes:
        console.print(f"note: {n}")
