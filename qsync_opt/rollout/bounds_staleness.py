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

**The room** (`room_seconds`, Little's law). At every instant at most (η + 1)·batch trajectories are admitted and
untrained, so over a run of length R the integral of that count is at most (η + 1)·batch·R. A trajectory trained in
step k is in it during each decode step it is part of, during its prefill, and during step k (disjoint spells: it is
on one worker at a time and trained after its last token); waiting in a queue or finished before its step only add.
Step k contributes batch·T_k. A decode step of B sequences, contexts summing to S, duration d, contributes B·d (the B
it holds are all in the room) and costs its worker d. On kind k, d ≥ f_k(B) + μ_k(B)·S for every S ≥ B
(`batch_lines`: one of the cost model's two lines at that B, the one above at S = B × the tokens' mean context: a
supporting line, exact wherever one of the two rules over the contexts that occur). Split over the step's tokens j,
contexts c_j:
  worker-seconds  d ≥ Σ_j (f_k(B)/B + μ_k(B)·c_j),      room  B·d ≥ Σ_j (f_k(B) + μ_k(B)·B·c_j),
the same step on both sides: a token decoded at a large batch is cheap in worker-seconds and dear in the room. The
program decides, fractionally, how many tokens x[k, I, g] of each context group g (priced at its lowest context, as
rollout.bounds does; valid since μ ≥ 0) each kind decodes at batches in each interval I = [lo, hi] of 1..cap_k
(`batch_intervals`, ratio BATCH_GRID; cap_k the kind's own cap where it has one, as the simulator applies it), each
token priced at the least over B in I of its work and, separately, of its room term (`interval_prices`, so a
coarser grid only loosens it), and how many prefills each kind does:
  minimize R  s.t.  Σ_g x[·, ·, g] = the tokens of group g;  Σ prefills = the trajectories,
                    per kind: Σ x·(f/B + μ·c_g) + φ·prefills ≤ count · R        (tied, per batch)
                              Σ x·(α + β·c_g) + φ·prefills ≤ count · R          (rollout.bounds' plane)
                    Σ x·(f + μ·B·c_g) + π·prefills + batch·Σ_k T_k ≤ (η + 1)·batch·R   (tied, per batch)
                    Σ x·(λ + μ·c_g) + π·prefills + batch·Σ_k T_k ≤ (η + 1)·batch·R     (the latency line)
                    R ≥ Σ_k T_k.
A real run gives a feasible point (x its tokens by kind, batch and context, R its length), so the least R bounds it.
The batch-free rows (the plane, the latency line; `coupled=False` keeps only them) are kept, so the room is never
looser than without the tie. It keeps the fleet's capacity per kind, each token's work and latency tied through the
batch it is decoded at, the kinds' own caps and the rule's room; it drops finished trajectories waiting for their
step and admitted ones waiting to start (both in the room), which trajectory decodes when, the order of the batches, and that tokens come in whole steps (it is fractional). The value
is taken only from a proven optimum (status optimal, the solver's bound); otherwise the room is left out and
`StalenessCeiling.note` says so (the trainer, plane and gate bounds stand).

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

from qsync_opt.rollout.bounds import (
    BUCKET_TOKENS,
    Ceiling,
    Plane,
    decode_plane,
    run_ceiling,
)
from qsync_opt.rollout.costs import WorkerCosts, all_worker_costs, micro_batch_seconds, trainer_step_s
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


BATCH_GRID = 1.1
"""Ratio of the decode-batch intervals of the room program (`batch_intervals`): batches 1–9 each alone, then
intervals [lo, ⌊1.1·lo⌋]; 25 intervals up to a cap of 64, 53 up to 1024."""


@dataclass(frozen=True)
class BatchLines:
    """One line per decode batch B = 1..cap under one kind's step: t(B, S) ≥ f_s[B − 1] + mu_s[B − 1]·S for every
    S ≥ B (seconds; S the contexts' sum), mu_s ≥ 0."""

    f_s: np.ndarray
    mu_s: np.ndarray

    @property
    def cap(self) -> int:
        return len(self.f_s)


@dataclass(frozen=True)
class RoomKind:
    """What the room program knows of one worker kind: its count, its batch-free plane (worker-seconds) and latency
    line (the room), and its lines per decode batch up to its own cap (both, tied)."""

    count: int
    plane: Plane
    latency: LatencyLine
    lines: BatchLines


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
    def room_tps(self) -> float | None:
        """The room program's bound alone (None: no proven optimum)."""
        return self.trajectories / self.window_s if self.window_s else None

    @property
    def gate_tps(self) -> float:
        """The gate recursion's bound alone."""
        return self.trajectories / self.gate_s if self.gate_s > 0 else math.inf

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


def batch_lines(c: WorkerCosts, cap: int, mean_ctx: float) -> BatchLines:
    """For each decode batch B = 1..cap the one of the cost model's two lines (t(B, S) = max of them) that is the
    larger at S = B·mean_ctx: the supporting line of t(B, ·) there, under it at every S ≥ B (the simulator prices
    no step below S = B). Raises RuntimeError on a negative slope (the model's KV reads and attention FLOPs grow
    with S; a negative slope would make pricing a token at its group's lowest context invalid)."""
    lines = np.array([c.decode_lines(b) for b in range(1, cap + 1)]) / 1e3
    a1, b1, a2, b2 = lines.T
    s = np.arange(1, cap + 1, dtype=float) * max(mean_ctx, 1.0)
    first = a1 + b1 * s >= a2 + b2 * s
    mu = np.where(first, b1, b2)
    if np.any(mu < 0):
        raise RuntimeError(f"rollout staleness ceiling: a decode line of {getattr(c, 'group', c)} falls with context")
    return BatchLines(np.where(first, a1, a2), mu)


def batch_intervals(cap: int, ratio: float = BATCH_GRID) -> list[tuple[int, int]]:
    """Consecutive intervals [lo, hi] covering 1..cap, hi = max(lo, ⌊lo·ratio⌋) (every batch its own at ratio 1)."""
    out, lo = [], 1
    while lo <= cap:
        hi = min(cap, max(lo, math.floor(lo * ratio)))
        out.append((lo, hi))
        lo = hi + 1
    return out


def interval_prices(bl: BatchLines, lo: int, hi: int, ctx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(work, room) per token at each context in `ctx` decoded at some batch in [lo, hi]: the least over those B of
    f(B)/B + μ(B)·c (its share of the step's worker-seconds) and of f(B) + μ(B)·B·c (its share of B × the step's
    duration, the step's term in the room's integral). Each is at most the token's own at its true B and context ≥ c."""
    B = np.arange(lo, hi + 1, dtype=float)[:, None]
    f, mu = bl.f_s[lo - 1:hi, None], bl.mu_s[lo - 1:hi, None]
    c = np.asarray(ctx, dtype=float)[None, :]
    return np.min(f / B + mu * c, axis=0), np.min(f + mu * B * c, axis=0)


def room_seconds(kinds: list[RoomKind], prompts, lengths, trainer_s: float, eta: int, batch: int,
                 coupled: bool = True, ratio: float = BATCH_GRID, held_s: float | None = None) -> float | None:
    """The least R of the room program in the module docstring (`coupled`: with the rows that tie each token's work
    to its latency through its decode batch; else only the batch-free rows); None without a proven optimum.
    `held_s`: the least seconds, summed over the steps, that a step holds its batch in the room once the batch is
    in (a streaming trainer: its last micro-batch, `last_micro_batch_floor`); default the steps' whole `trainer_s`."""
    prompts = np.asarray(prompts, dtype=float)
    lengths = np.asarray(lengths, dtype=float)
    top = float((prompts + lengths).max())
    edges = np.arange(float(prompts.min()), top + BUCKET_TOKENS, BUCKET_TOKENS)
    below = np.array([float(np.clip(e - prompts, 0, lengths).sum()) for e in edges])
    counts = np.diff(below)
    live = np.flatnonzero(counts > 0)
    ctx = edges[live]
    p = Problem("rollout-staleness-ceiling")
    R = p.add_var("R", "continuous", lb=float(trainer_s), ub=math.inf)
    plane_load = {k: {R: -float(kd.count)} for k, kd in enumerate(kinds)}  # worker-seconds, batch-free plane
    batch_load = {k: {R: -float(kd.count)} for k, kd in enumerate(kinds)}  # worker-seconds, per decode batch
    room = {R: -float((eta + 1) * batch)}  # the room, each token at its batch-free latency line
    batch_room = {R: -float((eta + 1) * batch)}  # the room, each token's share of B × its step
    share = {int(g): {} for g in live}
    for k, kd in enumerate(kinds):
        for i, iv in enumerate(batch_intervals(kd.lines.cap, ratio) if coupled else [None]):
            work, lat = interval_prices(kd.lines, *iv, ctx) if coupled else (None, None)
            for j, g in enumerate(live):
                # tokens of group g decoded on kind k at a batch in interval i
                v = p.add_var(f"x_{g}_{k}_{i}", "continuous", lb=0.0, ub=math.inf)
                share[int(g)][v] = 1.0
                plane_load[k][v] = kd.plane.alpha_s + kd.plane.beta_s * float(ctx[j])
                room[v] = kd.latency.lambda_s + kd.latency.mu_s * float(ctx[j])
                if coupled:
                    batch_load[k][v] = float(work[j])
                    batch_room[v] = float(lat[j])
    for g, row in share.items():
        p.add_constraint(f"tokens_{g}", row, "==", float(counts[g]))
    pre = {}
    for k, kd in enumerate(kinds):
        v = p.add_var(f"prefill_{k}", "continuous", lb=0.0, ub=math.inf)
        pre[v] = 1.0
        plane_load[k][v] = batch_load[k][v] = kd.plane.prefill_s
        room[v] = batch_room[v] = kd.latency.prefill_s
    p.add_constraint("prefills", pre, "==", float(len(lengths)))
    trained = -float(batch) * float(trainer_s if held_s is None else held_s)
    for k, row in plane_load.items():
        p.add_constraint(f"load_{k}", row, "<=", 0.0)
        if coupled:
            p.add_constraint(f"batch_load_{k}", batch_load[k], "<=", 0.0)
    p.add_constraint("staleness_room", room, "<=", trained)
    if coupled:
        p.add_constraint("staleness_room_by_batch", batch_room, "<=", trained)
    p.objective = {R: 1.0}
    raw = get_backend("highs").solve(p, SolveOptions(time_limit_s=60.0, rel_gap=0.0, threads=1))
    # only a proven optimum bounds the run length; 1e-6 of it is left for the solver's feasibility tolerances
    if raw.status == "optimal" and raw.bound is not None and raw.bound_in_plan_units:
        return max(0.0, float(raw.bound)) * (1 - 1e-6)
    return None


def room_kinds(job, kinds: list[WorkerCosts], prompts, lengths, min_ctx: float) -> list[RoomKind]:
    """The room program's view of each kind for these trajectories: the plane and latency line over the fleet's cap
    (as rollout.bounds), the lines per batch up to the kind's own cap (`rollout.workers[].batch_cap`, else the
    fleet's), each at the tokens' mean context."""
    r = job.rollout
    cap = r.repack.batch_cap
    own = {w.group: w.batch_cap for w in r.workers if w.batch_cap is not None}
    n = np.asarray(lengths, dtype=float)
    tokens, ctx_sum = float(n.sum()), float((n * np.asarray(prompts, dtype=float) + n * (n - 1) / 2).sum())
    return [RoomKind(c.count, decode_plane(c, cap, min_ctx, tokens, ctx_sum),
                     latency_line(c, cap, min_ctx, tokens, ctx_sum),
                     batch_lines(c, min(cap, own.get(c.group, cap)), ctx_sum / tokens)) for c in kinds]


def least_latencies(job, drawn, costs: list[WorkerCosts] | None = None) -> np.ndarray:
    """Each trajectory's least decode latency, (prompts, lengths) of `drawn`: its quickest prefill plus each of its
    steps at the latency line λ + μ·c of its context c, on the quickest kind (the line lies under `decode_ms` at every
    batch up to the cap, so no schedule decodes the trajectory sooner)."""
    prompts = np.asarray(drawn[0], dtype=float)
    lengths = np.asarray(drawn[1], dtype=float)
    cap = job.rollout.repack.batch_cap
    q = lengths * prompts + lengths * (lengths - 1) / 2
    tokens, ctx_sum = float(lengths.sum()), float(q.sum())
    lat = None
    for c in costs or all_worker_costs(job):
        ln = latency_line(c, cap, float(prompts.min()), tokens, ctx_sum)
        mine = ln.lambda_s * lengths + ln.mu_s * q + ln.prefill_s
        lat = mine if lat is None else np.minimum(lat, mine)
    return lat


def gate_seconds(job, drawn, trainer_steps, eta: int, costs: list[WorkerCosts] | None = None,
                 last_steps=None) -> tuple[float, float]:
    """(end of the last step, start of the first) at their earliest under the admission gate, the trainer's steps
    lasting `trainer_steps` (seconds each, in order), each drawn trajectory at its least decode latency on the
    quickest kind (the recursion in the module docstring). `last_steps`: for a streaming trainer, which computes a
    step's micro-batches as its trajectories finish, the least seconds of each step's last micro-batch
    (`last_micro_batch_floor`): a step ends no sooner than its whole compute after the previous one, nor than its
    last micro-batch after its batch is in (default: the whole step; it starts once its batch is in)."""
    lat = least_latencies(job, drawn, costs)
    B = job.rollout.workload.batch
    first = 0.0
    tau = [0.0]  # tau[j]: end of step j (tau[0] = 0: the start)
    pending = np.empty(0)  # finish times not yet below a step's start
    done = 0  # trajectories finished by the last step's start
    last_steps = trainer_steps if last_steps is None else last_steps
    for k, (t_k, last_k) in enumerate(zip(trainer_steps, last_steps), start=1):
        # group g (ids g·B …) opens at the end of step g − η: step k − 1 opens group k − 1 + η (the start opens 0..η)
        lo = 0 if k == 1 else (k - 1 + eta) * B
        hi = min(len(lat), (k + eta) * B)
        pending = np.concatenate([pending, tau[k - 1] + lat[lo:hi]])
        need = k * B - done
        if need > len(pending):
            return math.inf, 0.0  # fewer trajectories than the run trains (not with the simulator's draw)
        ready = -math.inf if need <= 0 else float(np.partition(pending, need - 1)[need - 1])  # the batch is in
        start = max(tau[k - 1], ready)
        below = pending <= start
        done += int(below.sum())
        pending = pending[~below]
        # the step's whole compute after the previous step, and its last micro-batch after its batch is in
        tau.append(max(tau[k - 1] + float(t_k), ready + float(last_k)))
        first = tau[1] - float(t_k) if k == 1 else first
    return tau[-1], first


def last_micro_batch_floor(train_s, tokens, micro_batches: int, per_step_s: float | None = None) -> float:
    """The least seconds a step's last micro-batch can take, `tokens` (prompt + response) per trajectory of the step:
    the last micro-batch holds batch // micro_batches of them (rollout.costs.micro_batch_bounds), at the least its
    fewest tokens (a schedule may finish the shortest last), priced as rollout.costs.micro_batch_seconds prices it
    (unpadded: a trainer that pads computes more). One micro-batch: the whole step."""
    t = np.sort(np.asarray(tokens, dtype=float))
    n = len(t) // micro_batches
    return micro_batch_seconds(train_s, float(t[:n].sum()) if micro_batches > 1 else float(t.sum()), micro_batches,
                               True, per_step_s)


def staleness_run_ceiling(job, consumed, drawn=None, eta: int | None = None, costs: list[WorkerCosts] | None = None,
                          train_s=None, long_run: bool = False, micro_batches: int | None = None) -> StalenessCeiling:
    """The ceiling under the staleness rule for a run whose trainer consumed `consumed`, (prompt, length) per
    trajectory in training order, in batches of the job's batch size; `drawn`: (prompts, lengths) of every
    trajectory the run could admit, in id order (default: the simulator's draw for the job's seed). `eta`: the
    job's (η = 0 is taken as 1, as the simulator does). `long_run`: leave out the one-off wait for the first batch
    (a looser bound, the rate a long run approaches). `micro_batches`: the trainer's per step (default the job's
    rollout.trainer_micro_batches); more than 1, a streaming trainer (gate_seconds, room_seconds)."""
    arr = np.asarray(consumed, dtype=float).reshape(-1, 2)
    r = job.rollout
    eta = max(1, int(eta if eta is not None else (r.policy.eta or 1)))
    B = r.workload.batch
    per_step = r.trainer_step_s if train_s is None else None
    train_s = train_s or (lambda tokens: trainer_step_s(job, tokens))
    steps = [train_s(float(arr[i:i + B].sum())) for i in range(0, len(arr), B)]
    m = r.trainer_micro_batches if micro_batches is None else micro_batches
    lasts = [last_micro_batch_floor(train_s, arr[i:i + B].sum(axis=1), m, per_step) for i in range(0, len(arr), B)]
    if drawn is None:
        drawn = draw(job, len(steps), eta, r.seed)
    base = run_ceiling(job, arr, costs, train_s)
    kinds = costs or all_worker_costs(job)
    prompts, lengths = arr[:, 0], arr[:, 1]
    min_ctx = float(min(prompts.min(), np.min(drawn[0]))) if len(prompts) else 1.0
    window = room_seconds(room_kinds(job, kinds, prompts, lengths, min_ctx), prompts, lengths, base.trainer_s, eta, B,
                          held_s=None if m == 1 else float(sum(lasts)))
    end, first = gate_seconds(job, drawn, steps, eta, kinds, None if m == 1 else lasts)
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
