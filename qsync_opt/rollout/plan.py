"""The rollout plan: every policy simulated under the same costs, one recommended (its report: rollout.run_report).

`solve(job)` simulates each variant (sync, one-step-off, stale, partial-rollout, trajectory-async,
and trajectory-async with best-fit and program repack) and recommends one (`recommend`): the simplest
variant, in that order, within TIE_FRAC of the highest trajectories/s. The figures are predictions of
the simulator under the serving cost model (or calibrated costs), not measurements. After a real run
(`qsync-opt run --real`), `recommend_measured` recommends on the measured figures instead, the calibrated
simulator deciding only between policies the measurement does not separate (`separated`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from qsync_opt.io import atomic_write_text
from qsync_opt.rollout.admission import planned_job
from qsync_opt.rollout.agreement import figures_tied, ratio_interval
from qsync_opt.rollout.bounds_staleness import staleness_ceiling
from qsync_opt.rollout.costs import all_worker_costs, sync_costs
from qsync_opt.rollout.sim_worker import read_msg, write_msg
from qsync_opt.rollout.simulate import VARIANTS, SimResult, simulate, variant_of
from qsync_opt.solver.budget import Budget
from qsync_opt.spec.load import load_plan_file

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


MEASURED_TIE_FRAC = 0.15
"""A real run of fewer than SIGN_TEST_ROUNDS rounds cannot estimate its own noise: two policies whose measured
(median-round) throughputs are within this fraction of the higher one are not separated by it. It is above the gap
docs/rollout.md ("Within 15%") records between two policies that ran one schedule in a single real run on a shared
machine: a gap that size is the run's noise, not an order."""

SIGN_TEST_ROUNDS = 6
"""From this many rounds the sign test reaches 95% (`agreement.ratio_interval`): two policies are then separated when
the interval of their per-round throughput ratio excludes 1, whatever their medians."""


@dataclass(frozen=True)
class MeasuredRecommendation:
    """`recommend_measured`: the policy a real run recommends, why, by which rule, and where the simulation (under the
    spec's costs) and the simulator calibrated from the run disagree with what was measured."""

    variant: str
    reason: str
    rule: str
    """How the measurement separates two policies (one sentence, for the report and the console)."""
    disagreements: list[str]
    ranks: dict[str, tuple[int, int, int | None]]
    """Policy -> its rank (1 = fastest) measured, calibrated, simulated (None without a simulated figure)."""


def separated(measured: dict[str, float], a: str, b: str, rounds: dict[str, list[float]] | None = None) -> bool:
    """Does the real run order `a` and `b`? With SIGN_TEST_ROUNDS rounds or more of per-round throughputs, when the
    95% sign-test interval of their per-round ratio excludes 1; otherwise when their measured figures differ by
    more than MEASURED_TIE_FRAC of the higher."""
    if rounds is not None and min(len(rounds[a]), len(rounds[b])) >= SIGN_TEST_ROUNDS:
        lo, hi, _ = ratio_interval(rounds, a, b)
        return not lo <= 1.0 <= hi
    return abs(measured[a] - measured[b]) > MEASURED_TIE_FRAC * max(measured[a], measured[b])


def separation_rule(n_rounds: int) -> str:
    """`separated`'s rule for a run of `n_rounds` rounds, in words."""
    if n_rounds >= SIGN_TEST_ROUNDS:
        return (f"{n_rounds} rounds: two policies count as separated by the measurement when the 95% sign-test "
                "interval of their per-round throughput ratio excludes 1")
    return (f"{n_rounds} round(s) cannot estimate the run's own noise (the sign test needs {SIGN_TEST_ROUNDS}): two "
            f"policies count as separated by the measurement only when their measured throughputs differ by more "
            f"than {MEASURED_TIE_FRAC:.0%}")


def _ranks(figs: dict[str, float]) -> dict[str, int]:
    """Policy -> 1 + the number of policies strictly faster (policies predicted alike share a rank)."""
    return {v: 1 + sum(1 for w, y in figs.items() if y > x and not figures_tied(x, y)) for v, x in figs.items()}


def recommend_measured(measured: dict[str, float], calibrated: dict[str, float],
                       rounds: dict[str, list[float]] | None = None, simulated: dict[str, float] | None = None,
                       simulated_pick: str | None = None) -> MeasuredRecommendation:
    """The policy to recommend after a real run, on the best evidence there is: the measurement first. `measured`:
    policy -> measured trajectories/s (the median round); `calibrated`: the simulator calibrated from that run;
    `rounds`: policy -> every round's trajectories/s (for `separated`); `simulated` and `simulated_pick`: the plan's
    figures under the spec's costs and its recommendation, for the disagreements only.

    The fastest measured policy is recommended unless the measurement does not separate it from others (`separated`);
    among those, the calibrated simulator's fastest, and within TIE_FRAC of that the simplest (VARIANTS order).
    `disagreements` says, in words, where the simulation's recommendation ranks when measured, and each pair the
    measurement separates that the calibrated simulator, or the simulation under the spec's costs, orders the
    other way."""
    order = sorted(measured, key=lambda v: -measured[v])
    best = order[0]
    n_rounds = min((len(x) for x in rounds.values()), default=1) if rounds else 1
    rule = separation_rule(n_rounds)
    close = [v for v in order if not separated(measured, best, v, rounds)]
    if len(close) == 1:
        pick = best
        reason = f"measured {measured[best]:.2f} trajectories/s here, the fastest of {len(order)}"
        if len(order) > 1:
            runner = order[1]
            reason += (f", {measured[best] / measured[runner]:.2f}x the next ({runner}, {measured[runner]:.2f}), "
                       "which the measurement separates from it")
    else:
        top = max(close, key=lambda v: calibrated[v])
        tied = [v for v in close if calibrated[v] >= (1 - TIE_FRAC) * calibrated[top]]
        rank = {v: i for i, v in enumerate(VARIANTS)}
        pick = min(tied, key=lambda v: rank.get(v, len(rank)))
        listed = ", ".join(f"{v} {measured[v]:.2f}" for v in close)
        reason = f"the measurement does not separate {listed} trajectories/s; "
        if len(tied) == 1:
            reason += (f"of those the simulator calibrated from this run predicts {pick} fastest "
                       f"({calibrated[pick]:.2f} trajectories/s)")
        else:
            reason += (f"of those the calibrated simulator predicts {', '.join(tied)} within {TIE_FRAC:.0%} of each "
                       f"other, so the simplest, {pick}, is recommended")
    m_rank, c_rank = _ranks(measured), _ranks(calibrated)
    s_rank = _ranks(simulated) if simulated else {}
    ranks = {v: (m_rank[v], c_rank[v], s_rank.get(v)) for v in order}
    dis = []
    if simulated_pick is not None and simulated_pick != pick and simulated_pick in measured:
        sim = f" ({simulated[simulated_pick]:.2f} trajectories/s simulated)" if simulated else ""
        dis.append(f"the simulation under the spec's costs recommends {simulated_pick}{sim}; measured here it ranks "
                   f"{m_rank[simulated_pick]} of {len(order)} ({measured[simulated_pick]:.2f} against "
                   f"{measured[best]:.2f} for {best})")
    for i, a in enumerate(order):
        for b in order[i + 1:]:  # a measured faster than b
            if not separated(measured, a, b, rounds):
                continue
            against = [f"{name} predicts {b} {figs[b] / figs[a]:.2f}x {a}"
                       for name, figs in (("the calibrated simulator", calibrated), ("the simulation", simulated))
                       if figs and figs[b] > figs[a] and not figures_tied(figs[a], figs[b])]
            if against:
                dis.append(f"{a} measured {measured[a] / measured[b]:.2f}x {b}; {'; '.join(against)}")
    return MeasuredRecommendation(pick, reason, rule, dis, ranks)


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
    stale_over_eta_frac: float | None = None
    """SimResult.stale_over_eta_frac: the share of trained trajectories staler than η (None: a barrier policy)."""
    ceiling_tps: float | None = None
    """The proven ceiling of this policy's run (SimResult.ceiling_tps): no schedule of the trajectories it trained
    is faster under these costs."""
    gate_fill_mean: float | None = None
    """SimResult's split of the staleness rule's room (None: a barrier policy): in use, and of it the shares finished
    and waiting for their step, decoding and in training; the wait's mean seconds; the trajectories' latency over the
    least the ceiling prices (SimResult.latency_stretch)."""
    gate_waiting_mean: float | None = None
    room_decoding_mean: float | None = None
    room_training_mean: float | None = None
    wait_s_mean: float | None = None
    latency_stretch: float | None = None

    def room_line(self) -> str | None:
        """Where the staleness rule's room went in this policy's run, in words (None: a barrier policy)."""
        if self.gate_fill_mean is None or self.room_decoding_mean is None:
            return None
        slower = "" if self.latency_stretch is None else (
            f"; its trajectories decoded {self.latency_stretch:.2f}x slower than the least latency the ceiling prices")
        w = self.wait_s_mean or 0.0
        wait = f"{w:.1f} s" if w >= 1 else f"{w * 1e3:.0f} ms"
        return (f"the staleness rule's room under {self.variant}: {self.gate_fill_mean:.0%} in use, "
                f"{self.room_decoding_mean:.0%} decoding, {self.gate_waiting_mean:.0%} finished and waiting for their "
                f"step ({wait} each), {self.room_training_mean:.0%} in training{slower}")

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
    """rollout.bounds_staleness.staleness_ceiling: what no policy obeying the staleness rule trains faster than, in the
    long run, under these costs."""

    model_config = ConfigDict(frozen=True)
    trajectories_per_s: float
    trainer_tps: float
    """The trainer's steps back to back."""
    rollout_tps: float
    """The rollouts' hardware, every decode step priced at the plane under its cost (no admission rule)."""
    bound_by: str
    """"trainer", "rollouts" or "staleness rule"."""
    eta: int | None = None
    """The staleness bound the ceiling counts (None: a plan made before it did)."""
    without_rule_tps: float | None = None
    """rollout.bounds.ceiling: the trainer and the rollouts' hardware alone (the staleness rule left out)."""
    rule_tps: float | None = None
    """The staleness rule's own bound (admission gate and its room; StalenessCeiling.rule_tps)."""
    note: str = ""
    """Why a part of the bound was left out (the rule's program ended without a proven optimum)."""

    @classmethod
    def of(cls, c) -> CeilingFigures:
        b = c.base
        return cls(trajectories_per_s=c.tps, trainer_tps=b.trainer_tps, rollout_tps=b.rollout_tps, bound_by=c.bound_by,
                   eta=c.eta, without_rule_tps=b.tps, rule_tps=c.rule_tps, note=c.note)

    def line(self) -> str:
        """The ceiling in words: its value, what binds, and the value without the staleness rule where it differs."""
        rule = f", staleness η={self.eta}" if self.eta is not None else ""
        text = (f"{self.trajectories_per_s:.2f} traj/s (proven, any policy{rule}, long run), bound by the "
                f"{self.bound_by} (trainer {self.trainer_tps:.2f}, rollouts' hardware {self.rollout_tps:.2f}"
                + (f", staleness rule {self.rule_tps:.2f}" if self.rule_tps is not None else "") + ")")
        if self.without_rule_tps is not None and self.without_rule_tps > self.trajectories_per_s * (1 + 1e-9):
            text += f"; without the staleness rule: {self.without_rule_tps:.2f} traj/s"
        return text + (f" ({self.note})" if self.note else "")


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
    trainer_micro_batches: int = 1
    """Micro-batches the trainer computes a step over under the streaming policies (rollout.trainer_micro_batches)."""
    evidence: str = "simulated"
    """What `recommended` rests on: "simulated" (the policies' figures here), or "measured here" once a real run
    (`qsync-opt run --real`, `run_report.write_measured`) has ranked the policies (`recommend_measured`)."""
    simulated_recommended: str | None = None
    """After a real run: what the simulation alone recommends (`recommend`) ..."""
    simulated_reason: str | None = None
    """... and why."""

    def figures(self, variant: str) -> PolicyFigures:
        return next(p for p in self.policies if p.variant == variant)

    def trainer_line(self) -> str:
        """How the trainer takes its batch, in words."""
        if self.trainer_micro_batches == 1:
            return "trainer: a step starts once its whole batch has finished"
        return (f"trainer: streaming, {self.trainer_micro_batches} micro-batches a step under the streaming policies "
                "(each computed once its trajectories have finished; the optimizer step after the last); sync and "
                "one-step-off train a round at once")

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @property
    def meets_bounds(self) -> None:
        """None: a rollout spec sets no bound a plan could miss (its policies are simulated and ranked)."""
        return None

    def save(self, path: str | Path) -> Path:
        """Write the plan's JSON atomically."""
        return atomic_write_text(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "RolloutPlan":
        """Read a plan `save` wrote; SpecError naming the file when it is not one."""
        return load_plan_file(cls, path, "rollout")


WORKER_MODULE = "qsync_opt.rollout.sim_worker"
"""What `simulate_variants` runs as `python -m` for a worker process."""

PARALLEL_AFTER_S = 0.5
"""`simulate_variants` runs the rest in worker processes when its first variant took at least this long: a worker
pays the package's import first, which only a long simulation wins back (docs/rollout.md)."""


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


def solve(job, budget: Budget | None = None, *, steps: int | None = None, variants=VARIANTS,
          keep_results: dict | None = None, processes: int | None = None) -> RolloutPlan:
    """Simulate every policy variant of `job` and recommend one. `keep_results`, if a dict, receives
    variant -> SimResult (without timelines: `run_report` keeps those). `processes`: as for `simulate_variants`
    (1: everything in this process, no worker started).

    `budget` is the call's (the registry passes one to every kind): a rollout plan is simulation,
    not a timed search, so it draws nothing from it; each simulated repack decision has its own
    limit, `rollout.solver.time_limit_s`, inside the simulation. With rollout.repack.choose_cap the batch cap is
    chosen first (rollout.admission.planned_job) and every figure is at it; a note says which and why."""
    job, notes = planned_job(job, steps)
    results = simulate_variants(job, variants, processes=processes, steps=steps, timeline_until=None)
    if keep_results is not None:
        keep_results.update(results)
    return plan_from(job, results, steps, notes)


CUT_NOTE_FRAC = 0.01
"""A plan notes max_len when it cuts more than this share of the responses (more than a p99 tail)."""


def plan_from(job, results: dict[str, SimResult], steps: int | None = None,
              extra_notes: list[str] | None = None) -> RolloutPlan:
    """The plan of `job` from its simulated variants (`simulate_variants`); `extra_notes` go after its own."""
    r = job.rollout
    recommended, reason = recommend(results.values())
    w = r.workload
    mean_prompt = w.prompt_len if isinstance(w.prompt_len, int) else w.prompt_len.mean(w.max_prompt())
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
    notes += extra_notes or []
    return RolloutPlan(name=job.name, model=r.model.label, batch=w.batch, recommended=recommended, reason=reason,
                       spec_policy=variant_of(job), policies=[PolicyFigures.of(x) for x in results.values()],
                       workers=workers, broadcast_s=sc.broadcast_s, push_s=sc.push_s,
                       steps=steps or r.steps, notes=notes,
                       ceiling=CeilingFigures.of(staleness_ceiling(job, steps=steps)),
                       trainer_micro_batches=r.trainer_micro_batches)
