"""A proven ceiling that counts the staleness rule: rollout.bounds' trainer and decode-plane bounds, plus two bounds
of the rule itself, its admission gate (an exact recursion) and its room (a linear program on the shared IR).

**The rule.** Every policy the simulator runs admits new trajectories in id order, and only while
admitted ≤ (η + V + 1)·batch, V the trainer steps done (AReaL's rule; sync and one-step-off admit less; η ≥ 1, as in
the simulator). It is a count, not a per-trajectory deadline: a long trajectory admitted within it may be trained
many versions later, so a bound that assumed "started under version v, trained by step v + η + 1" would not hold
for these policies. Two consequences: cohort g (ids g·batch … (g + 1)·batch − 1) is admitted no earlier than the end
of step g − η (time 0 for g ≤ η); and at every instant at most (η + 1)·batch trajectories are admitted and not yet
trained (the batch in training included).

**The latency of a token.** A decode step of B sequences whose contexts sum to S, one of them at context c (so
S ≥ c + B − 1), takes at least λ + μ·c for every B ≤ cap (`latency_line`, exact over that domain like
rollout.bounds.decode_plane: t − μ·c is convex in c along S = c + B − 1). Linear in c, so it also holds under the
simulator's chunks (a chunk is priced at its mean context). A trajectory of prompt p and length n therefore takes
at least ℓ = Σ_j (λ + μ·(p + j)) + π from admission to its last token on one kind (π: the quickest prefill any
micro-batch takes); interrupting, re-queueing, migrating, pausing only add.

**The gate** (`gate_seconds`). Step k starts no earlier than the end of step k − 1 and than the moment k·batch
trajectories are finished; trajectory i finishes no earlier than its cohort's opening plus ℓ_i (on the quickest
kind). With steps of the run's lengths in order, taking each step as early as these allow gives the least end of
the last step: every quantity is non-decreasing in the earlier steps' ends, so no other choice ends sooner. It keeps
the gate, each trajectory's latency and the trainer's steps; it drops capacity (any number decode at once, each at
its single-sequence step), which kind decodes what, and everything a policy waits on besides.

**The room** (`_program`, Little's law). A trajectory trained in step k stays admitted-and-untrained from its
admission to the end of step k: at least ℓ plus the step. Integrated over a run of length R:
Σ_i ℓ_i + batch · Σ_k T_k ≤ (η + 1)·batch · R. Tokens are grouped by context as in rollout.bounds (each group priced
at its lowest context) and split fractionally among the worker kinds, as are the prefills:
  minimize R  s.t.  every kind's worker-seconds (the decode plane and φ per prefill) ≤ its count · R,
                    Σ over tokens of their step latency on the kind that decoded them + Σ prefill latencies
                        + batch · Σ_k T_k ≤ (η + 1)·batch · R,
                    R ≥ Σ_k T_k.
It keeps the fleet's decode capacity, each token's latency on its kind and the rule's room; it drops which
trajectory decodes when, the order of the batches, and the tie between a token's work and its latency being on one
worker. The value is taken only from a proven optimum (status optimal, the solver's bound); otherwise the room is
left out and `StalenessCeiling.note` says so (the trainer, plane and gate bounds stand).

Each bound holds in every run, so the ceiling's run length is the largest of rollout.bounds' (trainer, rollouts'
hardware), the gate's and the room's: never above the ceiling without the rule, and equal to it where the rule
leaves slack (η large).

`staleness_run_ceiling(job, consumed, drawn, ...)` is the bound for one run (the trajectories its trainer consumed,
in order, and those it could admit): every simulated run lies under it (tests/rollout/test_rollout_bounds_staleness.py).
`staleness_ceiling(job)` is the long-run one over the first steps × batch trajectories the simulator draws, with
rollout.bounds.ceiling's caveat (a finite run may train its short trajectories first); it also leaves out the one-off
wait for the first batch, which a long run amortises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qsync_opt.rollout.bounds import BUCKET_TOKENS, Ceiling, decode_plane, run_ceiling
from qsync_opt.rollout.costs import WorkerCosts, all_worker_costs, trainer_step_s
from qsync_opt.rollout.sim_workload import draw
from qsync_opt.solver.backends import get_backend
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.solver.problem import Problem


@dataclass(frozen=True)
class LatencyLine:
    """Any decode step holding a sequence at context c takes ≥ lambda_s + mu_s·c seconds (B ≤ cap, c ≥ min_ctx);
    a prefill keeps its sequences waiting ≥ prefill_s."""

    lambda_s: float
    mu_s: float
    prefill_s: float


@dataclass(frozen=True)
class StalenessCeiling:
    """Upper bound on trajectories/s for `trajectories` trained in steps of `batch` under the staleness bound η."""

    eta: int
    base: Ceiling
    """rollout.bounds' ceiling of the same trajectories (no staleness rule)."""
    window_s: float | None
    """The program's least run length (trainer, decode plane and the rule's room together); None: no proven optimum."""
    gate_s: float
    """The gate recursion's least run length (each cohort opens with a trainer step; each trajectory's latency)."""
    note: str = ""

    @property
    def trajectories(self) -> int:
        return self.base.trajectories

    @property
    def run_s(self) -> float:
        return max(self.base.trainer_s, self.base.rollout_s, self.window_s or 0.0, self.gate_s)

    @property
    def tps(self) -> float:
        """No run of these trajectories under the rule trains faster than this."""
        return self.trajectories / self.run_s if self.run_s > 0 else math.inf

    @property
    def proven(self) -> bool:
        return self.window_s is not None

    @property
    def bound_by(self) -> str:
        """What binds: the trainer, the rollouts' hardware, or the staleness rule (its room or its gate, above both)."""
        if max(self.window_s or 0.0, self.gate_s) > max(self.base.trainer_s, self.base.rollout_s) * (1 + 1e-9):
            return "staleness rule"
        return self.base.bound_by

    @property
    def rule_tps(self) -> float:
        """The staleness rule's own bound (the larger of the room program's and the gate recursion's run length)."""
        s = max(self.window_s or 0.0, self.gate_s)
        return self.trajectories / s if s > 0 else math.inf


def latency_line(c: WorkerCosts, cap: int, min_ctx: float, tokens: float, ctx_sum: float) -> LatencyLine:
    """The line under the step time seen by one sequence that bounds `tokens` tokens of context sum `ctx_sum`
    highest: for μ in [0, least slope at S → ∞] the largest λ with t(B, S) ≥ λ + μ·c over B ≤ cap, c ≥ min_ctx,
    S ≥ c + B − 1 (the others hold at least a token each); λ·tokens + μ·ctx_sum is concave in μ (λ is a minimum
    of lines in μ), so a ternary search finds the best."""
    lines = np.array([c.decode_lines(b) for b in range(1, cap + 1)]) / 1e3
    a1, b1, a2, b2 = lines.T
    others = np.arange(cap, dtype=float)  # B − 1
    c0 = max(min_ctx, 1.0)
    mu_max = float(np.min(np.maximum(b1, b2)))

    def lam(mu: float) -> float:
        def excess(cc):
            s = np.maximum(cc + others, others + 1)  # decode_ms prices S below B as S = B
            return np.maximum(a1 + b1 * s, a2 + b2 * s) - mu * cc

        best = excess(np.full(cap, c0))
        with np.errstate(divide="ignore", invalid="ignore"):
            cross = np.where(b1 != b2, (a2 - a1) / (b1 - b2) - others, -np.inf)
        inside = cross > c0
        best = np.where(inside, np.minimum(best, excess(np.where(inside, cross, c0))), best)
        return float(np.min(best))

    lo, hi = 0.0, max(mu_max, 0.0)
    for _ in range(200):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if lam(m1) * tokens + m1 * ctx_sum < lam(m2) * tokens + m2 * ctx_sum:
            lo = m1
        else:
            hi = m2
    wait = min(min(c.prefill_ms(m, c0), c.prefill_set_ms([c0] * m)) for m in range(1, cap + 1)) / 1e3
    return LatencyLine(lam(lo), lo, max(0.0, wait))


def _program(kinds, planes, lats, prompts, lengths, trainer_s: float, eta: int, batch: int) -> float | None:
    """The least R of the program in the module docstring; None without a proven optimum."""
    top = float((prompts + lengths).max())
    edges = np.arange(float(prompts.min()), top + BUCKET_TOKENS, BUCKET_TOKENS)
    below = np.array([float(np.clip(e - prompts, 0, lengths).sum()) for e in edges])
    counts = np.diff(below)
    p = Problem("rollout-staleness-ceiling")
    R = p.add_var("R", "continuous", lb=float(trainer_s), ub=math.inf)
    load = {k: {R: -float(c.count)} for k, c in enumerate(kinds)}
    room = {R: -float((eta + 1) * batch)}
    for g, n in enumerate(counts):
        if n <= 0:
            continue
        share = {}
        for k, (pl, lt) in enumerate(zip(planes, lats)):
            v = p.add_var(f"x_{g}_{k}", "continuous", lb=0.0, ub=math.inf)  # tokens of group g on kind k
            share[v] = 1.0
            load[k][v] = pl.alpha_s + pl.beta_s * float(edges[g])
            room[v] = lt.lambda_s + lt.mu_s * float(edges[g])
        p.add_constraint(f"tokens_{g}", share, "==", float(n))
    share = {}
    for k, (pl, lt) in enumerate(zip(planes, lats)):
        v = p.add_var(f"prefill_{k}", "continuous", lb=0.0, ub=math.inf)
        share[v] = 1.0
        load[k][v] = pl.prefill_s
        room[v] = lt.prefill_s
    p.add_constraint("prefills", share, "==", float(len(lengths)))
    for k, row in load.items():
        p.add_constraint(f"load_{k}", row, "<=", 0.0)
    p.add_constraint("staleness_room", room, "<=", -float(batch) * float(trainer_s))
    p.objective = {R: 1.0}
    raw = get_backend("highs").solve(p, SolveOptions(time_limit_s=60.0, rel_gap=0.0, threads=1))
    # only a proven optimum bounds the run length; 1e-6 of it is left for the solver's feasibility tolerances
    if raw.status == "optimal" and raw.bound is not None and raw.bound_in_plan_units:
        return max(0.0, float(raw.bound)) * (1 - 1e-6)
    return None


def gate_seconds(job, drawn, trainer_steps, eta: int, costs: list[WorkerCosts] | None = None) -> tuple[float, float]:
    """(end of the last step, start of the first) at their earliest under the admission gate, the trainer's steps
    lasting `trainer_steps` (seconds each, in order), each drawn trajectory at its least decode latency on the
    quickest kind (the recursion in the module docstring)."""
    prompts = np.asarray(drawn[0], dtype=float)
    lengths = np.asarray(drawn[1], dtype=float)
    kinds = costs or all_worker_costs(job)
    B = job.rollout.workload.batch
    cap = job.rollout.repack.batch_cap
    q = lengths * prompts + lengths * (lengths - 1) / 2
    tokens, ctx_sum = float(lengths.sum()), float(q.sum())
    lat = None
    for c in kinds:
        ln = latency_line(c, cap, float(prompts.min()), tokens, ctx_sum)
        mine = ln.lambda_s * lengths + ln.mu_s * q + ln.prefill_s
        lat = mine if lat is None else np.minimum(lat, mine)
    first = 0.0
    tau = [0.0]  # tau[j]: end of step j (tau[0] = 0: the start)
    pending = np.empty(0)  # finish times not yet below a step's start
    done = 0  # trajectories finished by the last step's start
    for k, t_k in enumerate(trainer_steps, start=1):
        # group g (ids g·B …) opens at the end of step g − η: step k − 1 opens group k − 1 + η (the start opens 0..η)
        lo = 0 if k == 1 else (k - 1 + eta) * B
        hi = min(len(lat), (k + eta) * B)
        pending = np.concatenate([pending, tau[k - 1] + lat[lo:hi]])
        need = k * B - done
        if need > len(pending):
            return math.inf, 0.0  # fewer trajectories than the run trains (not with the simulator's draw)
        start = tau[k - 1]
        if need > 0:
            start = max(start, float(np.partition(pending, need - 1)[need - 1]))
        below = pending <= start
        done += int(below.sum())
        pending = pending[~below]
        tau.append(start + float(t_k))
        first = start if k == 1 else first
    return tau[-1], first


def staleness_run_ceiling(job, consumed, drawn=None, eta: int | None = None, costs: list[WorkerCosts] | None = None,
                          train_s=None, long_run: bool = False) -> StalenessCeiling:
    """The ceiling under the staleness rule for a run whose trainer consumed `consumed`, (prompt, length) per
    trajectory in training order, in batches of the job's batch size; `drawn`: (prompts, lengths) of every
    trajectory the run could admit, in id order (default: the simulator's draw for the job's seed). `eta`: the
    job's (η = 0 is taken as 1, as the simulator does). `long_run`: leave out the one-off wait for the first batch
    (a looser bound, the rate a long run approaches)."""
    arr = np.asarray(consumed, dtype=float).reshape(-1, 2)
    r = job.rollout
    eta = max(1, int(eta if eta is not None else (r.policy.eta or 1)))
    B = r.workload.batch
    train_s = train_s or (lambda tokens: trainer_step_s(job, tokens))
    steps = [train_s(float(arr[i:i + B].sum())) for i in range(0, len(arr), B)]
    if drawn is None:
        drawn = draw(job, len(steps), eta, r.seed)
    base = run_ceiling(job, arr, costs, train_s)
    kinds = costs or all_worker_costs(job)
    prompts, lengths = arr[:, 0], arr[:, 1]
    cap = r.repack.batch_cap
    min_ctx = float(min(prompts.min(), np.min(drawn[0]))) if len(prompts) else 1.0
    tokens, ctx_sum = float(lengths.sum()), float((lengths * prompts + lengths * (lengths - 1) / 2).sum())
    planes = [decode_plane(c, cap, min_ctx, tokens, ctx_sum) for c in kinds]
    lats = [latency_line(c, cap, min_ctx, tokens, ctx_sum) for c in kinds]
    window = _program(kinds, planes, lats, prompts, lengths, base.trainer_s, eta, B)
    end, first = gate_seconds(job, drawn, steps, eta, kinds)
    gate = end - first if long_run else end
    note = "" if window is not None else ("the staleness program ended without a proven optimum: its room bound is "
                                          "left out (the trainer, decode-plane and gate bounds stand)")
    return StalenessCeiling(eta, base, window, gate, note)


def staleness_ceiling(job, seed: int | None = None, steps: int | None = None) -> StalenessCeiling:
    """The long-run ceiling under the job's η: staleness_run_ceiling over the first steps × batch trajectories the
    simulator draws (in order, the trainer's batches), as rollout.bounds.ceiling."""
    r = job.rollout
    steps = steps or r.steps
    eta = r.policy.eta or 1
    prompts, targets = draw(job, steps, eta, r.seed if seed is None else seed)
    n = steps * r.workload.batch
    return staleness_run_ceiling(job, np.stack([prompts[:n], targets[:n]], axis=1), (prompts, targets),
                                 long_run=True)
