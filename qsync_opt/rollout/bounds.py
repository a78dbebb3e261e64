"""Proven ceilings on a rollout job's throughput under the simulator's cost model: no policy, repack or schedule
goes above them.

* **The trainer.** Every trained batch costs its trainer step (rollout.costs.trainer_step_s), one after another, so a
  run of k steps lasts at least the sum of its k steps.
* **The rollouts.** A decode step of B sequences whose contexts sum to S costs t(B, S) (WorkerCosts.decode_ms, the
  larger of two lines in S at each B). Below it lies a plane: t(B, S) ≥ α·B + β·S for every 1 ≤ B ≤ cap and
  S ≥ B·p_min (`decode_plane`, exact over that domain: t − β·S is convex in S, so its least value is at S = B·p_min
  or at the lines' crossing). Summed over a run's steps, a worker's decoding time is at least α·(tokens it decoded) +
  β·(Σ of their contexts). A token's context is fixed by the workload, whatever the policy: a trajectory of prompt p
  and length n decodes at contexts p, p + 1, …, p + n − 1, wherever and whenever it runs (interrupting, re-queueing
  or migrating it only adds prefills). Every trajectory is also prefilled at least once, at no less than the
  cheapest per-sequence prefill at any micro-batch up to the cap (φ). Idle, sync, re-prefill and migration time only
  add. So a set of trajectories needs at least Σ (α·n + β·Q + φ) worker-seconds, Q = n·p + n(n − 1)/2, on one worker
  kind; on a fleet of several kinds, the least makespan of a fractional assignment of tokens (grouped by context,
  each group at its lowest context) and prefills to kinds, a linear program on the shared IR solved by HiGHS.

`run_ceiling(job, consumed, ...)` is the bound for one run: the trajectories its trainer consumed
(`Simulator.consumed`); every simulated run must lie under it (tests/rollout/test_rollout_bounds.py). `ceiling(job, seed)`
is the long-run ceiling: the same bound over the first steps × batch trajectories the simulator draws, in order;
as the run grows it holds for every policy, since all admitted work is then trained but for at most the η + 1 batches
in flight at the end. A finite run can sit a little above it by training its short trajectories and leaving long
ones in flight (`SimResult.ceiling_tps`, the ceiling of the run's own trajectories, shows how much).

These bound the model, not a machine: the simulator's decode is the serving cost model's (not a calibrated shared
host's, rollout.calibrate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qsync_opt.rollout.costs import WorkerCosts, all_worker_costs, trainer_step_s
from qsync_opt.rollout.sim_workload import draw
from qsync_opt.solver.backends import get_backend
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.solver.problem import Problem

BUCKET_TOKENS = 32
"""Width of the context groups of the multi-kind program (each group priced at its lowest context)."""


@dataclass(frozen=True)
class Plane:
    """t(B, S) ≥ alpha_s·B + beta_s·S for 1 ≤ B ≤ cap, S ≥ B·min_ctx (seconds); prefill_s ≤ any prefill per sequence."""

    alpha_s: float
    beta_s: float
    prefill_s: float


@dataclass(frozen=True)
class Ceiling:
    """Upper bounds on trajectories/s for a set of `trajectories` trained in `steps` steps of `batch`."""

    trajectories: int
    trainer_s: float
    """Least run length the trainer allows (its steps back to back)."""
    rollout_s: float
    """Least run length the rollouts allow (the worker-seconds the trajectories need, over the fleet)."""

    @property
    def trainer_tps(self) -> float:
        return self.trajectories / self.trainer_s if self.trainer_s > 0 else math.inf

    @property
    def rollout_tps(self) -> float:
        return self.trajectories / self.rollout_s if self.rollout_s > 0 else math.inf

    @property
    def tps(self) -> float:
        """No run of these trajectories trains faster than this."""
        return self.trajectories / max(self.trainer_s, self.rollout_s)

    @property
    def bound_by(self) -> str:
        return "trainer" if self.trainer_s >= self.rollout_s else "rollouts"


def _lines(c: WorkerCosts, cap: int) -> np.ndarray:
    """(cap, 4) array of t(B, S) = max(a1 + b1·S, a2 + b2·S) in seconds, B = 1..cap."""
    return np.array([c.decode_lines(b) for b in range(1, cap + 1)]) / 1e3


def _alpha(lines: np.ndarray, min_ctx: float, beta: float) -> float:
    """The largest α with α·B + β·S ≤ t(B, S) over 1 ≤ B ≤ cap, S ≥ B·min_ctx (β at most every slope at S → ∞)."""
    a1, b1, a2, b2 = lines.T
    B = np.arange(1, len(lines) + 1, dtype=float)
    s0 = B * max(min_ctx, 1.0)  # decode_ms prices S below B as S = B

    def excess(S):
        return np.maximum(a1 + b1 * S, a2 + b2 * S) - beta * S

    best = excess(s0)
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = np.where(b1 != b2, (a2 - a1) / (b1 - b2), -np.inf)
    inside = cross > s0
    best = np.where(inside, np.minimum(best, excess(np.where(inside, cross, s0))), best)
    return float(np.min(best / B))


def decode_plane(c: WorkerCosts, cap: int, min_ctx: float, tokens: float, ctx_sum: float) -> Plane:
    """The plane under `c`'s decode step that bounds `tokens` tokens of context sum `ctx_sum` highest: any β in
    [0, least slope at S → ∞] gives a valid plane with its α (`_alpha`); α·tokens + β·ctx_sum is concave in β, so a
    ternary search finds the best."""
    lines = _lines(c, cap)
    beta_max = float(np.min(np.maximum(lines[:, 1], lines[:, 3])))

    def value(beta):
        return _alpha(lines, min_ctx, beta) * tokens + beta * ctx_sum

    lo, hi = 0.0, max(beta_max, 0.0)
    for _ in range(200):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if value(m1) < value(m2):
            lo = m1
        else:
            hi = m2
    beta = lo
    prefill = min(min(c.prefill_ms(m, min_ctx), c.prefill_set_ms([min_ctx] * m)) / m for m in range(1, cap + 1)) / 1e3
    return Plane(_alpha(lines, min_ctx, beta), beta, prefill)


def _context_sums(prompts: np.ndarray, lengths: np.ndarray) -> tuple[float, float]:
    n = lengths.astype(float)
    return float(n.sum()), float((n * prompts + n * (n - 1) / 2).sum())


def _tokens_below(prompts: np.ndarray, lengths: np.ndarray, x: float) -> float:
    """Tokens decoded at a context below x: Σ clip(x − p, 0, n)."""
    return float(np.clip(x - prompts, 0, lengths).sum())


def rollout_seconds(job, prompts, lengths, costs: list[WorkerCosts] | None = None) -> float:
    """The least run length in which the fleet decodes and prefills these trajectories (seconds), any schedule."""
    prompts = np.asarray(prompts, dtype=float)
    lengths = np.asarray(lengths, dtype=float)
    kinds = costs or all_worker_costs(job)
    cap = job.rollout.repack.batch_cap
    min_ctx = float(prompts.min()) if len(prompts) else 1.0
    tokens, ctx_sum = _context_sums(prompts, lengths)
    planes = [decode_plane(c, cap, min_ctx, tokens, ctx_sum) for c in kinds]
    if len(kinds) == 1:
        pl, c = planes[0], kinds[0]
        return (pl.alpha_s * tokens + pl.beta_s * ctx_sum + pl.prefill_s * len(lengths)) / c.count
    return _multi_kind(kinds, planes, prompts, lengths)


def _multi_kind(kinds, planes, prompts, lengths) -> float:
    """min T over fractional assignments: tokens of each context group g (lowest context e_g) and the prefills
    split among kinds, each kind's worker-seconds ≤ its count · T."""
    top = float((prompts + lengths).max())
    edges = np.arange(float(prompts.min()), top + BUCKET_TOKENS, BUCKET_TOKENS)
    below = np.array([_tokens_below(prompts, lengths, e) for e in edges])
    counts = np.diff(below)
    p = Problem("rollout-ceiling")
    T = p.add_var("T", "continuous", lb=0.0, ub=math.inf)
    load = {k: {T: -float(c.count)} for k, c in enumerate(kinds)}
    for g, n in enumerate(counts):
        if n <= 0:
            continue
        share = {}
        for k, pl in enumerate(planes):
            v = p.add_var(f"x_{g}_{k}", "continuous", lb=0.0, ub=math.inf)  # tokens of group g on kind k
            share[v] = 1.0
            load[k][v] = pl.alpha_s + pl.beta_s * float(edges[g])
        p.add_constraint(f"tokens_{g}", share, "==", float(n))
    share = {}
    for k, pl in enumerate(planes):
        v = p.add_var(f"prefill_{k}", "continuous", lb=0.0, ub=math.inf)
        share[v] = 1.0
        load[k][v] = pl.prefill_s
    p.add_constraint("prefills", share, "==", float(len(lengths)))
    for k, row in load.items():
        p.add_constraint(f"load_{k}", row, "<=", 0.0)
    p.objective = {T: 1.0}
    raw = get_backend("highs").solve(p, SolveOptions(time_limit_s=60.0, rel_gap=0.0, threads=1))
    # only a proven optimum of the linear program bounds the makespan (a value found before it is an upper one);
    # 1e-6 of it is left for the solver's feasibility tolerances
    if raw.status == "optimal" and raw.bound is not None and raw.bound_in_plan_units:
        return max(0.0, float(raw.bound)) * (1 - 1e-6)
    raise RuntimeError(f"rollout ceiling: the linear program ended '{raw.status}' without a proven optimum")


def run_ceiling(job, consumed, costs: list[WorkerCosts] | None = None, train_s=None) -> Ceiling:
    """The ceiling for a run whose trainer consumed `consumed`, (prompt, length) per trajectory in training order,
    in batches of the job's batch size."""
    arr = np.asarray(consumed, dtype=float).reshape(-1, 2)
    B = job.rollout.workload.batch
    train_s = train_s or (lambda tokens: trainer_step_s(job, tokens))
    trainer = sum(train_s(float(arr[i:i + B].sum())) for i in range(0, len(arr), B))
    rollout = rollout_seconds(job, arr[:, 0], arr[:, 1], costs)
    return Ceiling(len(arr), trainer, rollout)


def ceiling(job, seed: int | None = None, steps: int | None = None) -> Ceiling:
    """The long-run ceiling: run_ceiling over the first steps × batch trajectories the simulator draws (in order)."""
    r = job.rollout
    steps = steps or r.steps
    prompts, targets = draw(job, steps, r.policy.eta or 1, r.seed if seed is None else seed)
    n = steps * r.workload.batch
    return run_ceiling(job, np.stack([prompts[:n], targets[:n]], axis=1))
