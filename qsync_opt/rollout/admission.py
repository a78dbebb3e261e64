"""The planner's choice of the decode-batch cap (`rollout.repack.batch_cap`, vLLM's max_num_seqs): the most
trajectories a rollout decodes together, which is also how many it admits.

**Why it is a lever.** The staleness rule admits at most (η + 1)·batch trajectories beyond those trained, the batch
in training included, so about (η + 1)·batch / W are in flight per rollout on W rollouts, fewer while a batch
trains. A cap well above that share lets the rollouts that admit first batch far above it while others wait: their
every decode step is slower (a step's cost grows with the batch and the contexts it reads), so their tokens, the
long tails among them, take longer, and the trainer, which waits for the batch-th finish, idles. A cap below the
share spreads the same room over more rollouts at smaller batches. Too low a cap leaves the rule's room unused and
the rollouts' hardware binds instead. Which way wins is a property of the fleet and the workload, so the planner
simulates candidates and keeps the spec's cap unless another is faster by more than the simulator resolves.

`cap_candidates(job)`: the spec's cap and, below it, ½, ¾ and 1 times the rule's share per rollout.
`choose_cap(job, variant)`: each candidate simulated under `variant`; the fastest if it beats the spec's cap by more
than plan.TIE_FRAC, else the spec's (the simulator is deterministic; a smaller margin is one workload draw). The
proven ceiling depends on the cap (its decode plane and latency line range over batches up to it): a plan at the
chosen cap is checked against the ceiling at that cap, which is never above the one at a higher cap.

**A slower kind's own cap** (`rollout.workers[].batch_cap`). On a fleet of two kinds a trajectory on the slower
one decodes several times slower than on the quicker (at one sequence each, whatever the batch), and the trainer
waits for the batch-th finish. Holding the slower kind to fewer trajectories at once leaves more of the rule's
room to the quicker kind. `choose_kind_caps` tries KIND_FRACTIONS of the fleet's cap for each slower kind, as
above. The ceiling is unchanged by it: its decode plane and latency line hold for every batch up to the fleet's
cap, so also for the smaller batches a kind's own cap allows (the bound stays valid, not sharper).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qsync_opt.rollout.costs import all_worker_costs
from qsync_opt.rollout.simulate import simulate, variant_of

SHARE_FRACTIONS = (0.5, 0.75, 1.0)
"""Candidate caps below the spec's, as fractions of the staleness rule's room per rollout ((η + 1)·batch / W)."""

CHOOSE_TIE_FRAC = 0.01
"""A candidate replaces the spec's cap only when more than this fraction faster (plan.TIE_FRAC: a one-method
margin this small is not resolved by one workload draw)."""


@dataclass(frozen=True)
class CapChoice:
    """The cap chosen, the spec's, and trajectories/s of `variant` at each candidate (in candidate order)."""

    cap: int
    spec_cap: int
    variant: str
    tps: dict[int, float]

    @property
    def changed(self) -> bool:
        return self.cap != self.spec_cap

    def line(self) -> str:
        """The choice in words, every candidate's figure beside it."""
        figs = ", ".join(f"{c}: {t:.2f}" for c, t in self.tps.items())
        if not self.changed:
            return (f"rollout.repack.batch_cap {self.spec_cap} kept (no candidate cap beats it by more than "
                    f"{CHOOSE_TIE_FRAC:.0%} under {self.variant}; traj/s by cap: {figs})")
        gain = self.tps[self.cap] / self.tps[self.spec_cap] - 1
        return (f"rollout.repack.batch_cap {self.cap} chosen for the spec's {self.spec_cap}: {self.variant} "
                f"+{gain:.1%} (traj/s by cap: {figs}); every figure of this plan is at cap {self.cap}")


def rule_share(job) -> float:
    """(η + 1)·batch / W: trajectories per rollout the staleness rule lets be admitted and untrained at once."""
    r = job.rollout
    eta = r.policy.eta or 1
    workers = sum(g.count for g in job.cluster.groups if g.name in {w.group for w in r.workers})
    return (eta + 1) * r.workload.batch / workers


def cap_candidates(job) -> list[int]:
    """The spec's cap first, then the distinct caps SHARE_FRACTIONS × rule_share below it, ascending."""
    spec = job.rollout.repack.batch_cap
    share = rule_share(job)
    below = sorted({max(1, math.ceil(f * share)) for f in SHARE_FRACTIONS} - {spec})
    return [spec] + [c for c in below if c < spec]


def with_cap(job, cap: int):
    """A copy of `job` whose rollouts decode at most `cap` trajectories together."""
    r = job.rollout
    return job.model_copy(update={"rollout": r.model_copy(update={"repack": r.repack.model_copy(
        update={"batch_cap": int(cap)})})})


def choose_cap(job, variant: str, steps: int | None = None) -> CapChoice:
    """Simulate `variant` at every cap_candidates(job) and keep the spec's cap unless one is more than
    CHOOSE_TIE_FRAC faster (then the fastest)."""
    spec = job.rollout.repack.batch_cap
    tps = {c: simulate(with_cap(job, c), variant, steps=steps, timeline_until=None).trajectories_per_s
           for c in cap_candidates(job)}
    best = max(tps, key=lambda c: (tps[c], c == spec))
    cap = best if tps[best] > (1 + CHOOSE_TIE_FRAC) * tps[spec] else spec
    return CapChoice(cap, spec, variant, tps)


def search_variant(job) -> str:
    """The variant the cap is chosen under: the spec's (variant_of), repack-best-fit for repack-program (they tie
    within the simulator's resolution at 50 steps, docs/rollout.md, and the program's solves cost minutes a case)."""
    v = variant_of(job)
    return "repack-best-fit" if v == "repack-program" else v


KIND_FRACTIONS = (0.0625, 0.125, 0.25, 0.5)
"""Candidate caps of a slower worker kind, as fractions of the fleet's cap."""


@dataclass(frozen=True)
class KindCapChoice:
    """A slower kind's own cap (`rollout.workers[].batch_cap`): chosen, the fleet's, and `variant`'s trajectories/s
    at each candidate."""

    group: str
    cap: int
    fleet_cap: int
    variant: str
    tps: dict[int, float]

    @property
    def changed(self) -> bool:
        return self.cap != self.fleet_cap

    def line(self) -> str:
        figs = ", ".join(f"{c}: {t:.2f}" for c, t in self.tps.items())
        if not self.changed:
            return (f"workers {self.group}: the fleet's cap {self.fleet_cap} kept (no smaller cap of this slower kind "
                    f"beats it by more than {CHOOSE_TIE_FRAC:.0%} under {self.variant}; traj/s by cap: {figs})")
        gain = self.tps[self.cap] / self.tps[self.fleet_cap] - 1
        return (f"workers {self.group}: batch_cap {self.cap} chosen (the fleet's {self.fleet_cap}): {self.variant} "
                f"+{gain:.1%} (traj/s by its cap: {figs}); a slower kind held to fewer trajectories leaves the "
                "staleness rule's room to the quicker one")


def slower_groups(job) -> list[str]:
    """Worker groups other than the quickest: a step of one sequence at the longest prompt takes longer there."""
    r = job.rollout
    ctx = float(r.workload.max_prompt())
    costs = all_worker_costs(job)
    quickest = min(c.decode_ms(1, ctx) for c in costs)
    return [c.group for c in costs if c.decode_ms(1, ctx) > quickest * (1 + 1e-9)]


def with_kind_cap(job, group: str, cap: int | None):
    """A copy of `job` whose workers of `group` decode at most `cap` trajectories together (None: the fleet's cap)."""
    r = job.rollout
    workers = [w.model_copy(update={"batch_cap": cap}) if w.group == group else w for w in r.workers]
    return job.model_copy(update={"rollout": r.model_copy(update={"workers": workers})})


def choose_kind_caps(job, variant: str, steps: int | None = None) -> tuple[object, list[KindCapChoice]]:
    """Each slower group's own cap in turn (slower_groups order): its current cap (the fleet's unless the spec
    sets one) and KIND_FRACTIONS of the fleet's cap below it, simulated under `variant`, the current kept unless one
    is more than CHOOSE_TIE_FRAC faster. Returns the job at the chosen caps and the choices."""
    fleet = job.rollout.repack.batch_cap
    choices = []
    for g in slower_groups(job):
        own = next(w.batch_cap for w in job.rollout.workers if w.group == g) or fleet
        cands = [own] + sorted({max(1, math.ceil(f * fleet)) for f in KIND_FRACTIONS} - {own})
        cands = [c for c in cands if c <= own]
        tps = {c: simulate(with_kind_cap(job, g, c), variant, steps=steps, timeline_until=None).trajectories_per_s
               for c in cands}
        best = max(tps, key=lambda c: (tps[c], c == own))
        cap = best if tps[best] > (1 + CHOOSE_TIE_FRAC) * tps[own] else own
        choices.append(KindCapChoice(g, cap, fleet, variant, tps))
        job = with_kind_cap(job, g, cap)
    return job, choices


def planned_job(job, steps: int | None = None):
    """(the job the plan simulates, its notes): `job` itself and no note unless rollout.repack.choose_cap; else
    `job` at choose_cap's fleet cap, then at choose_kind_caps' caps of its slower kinds, both under search_variant,
    one note per choice."""
    if not job.rollout.repack.choose_cap:
        return job, []
    variant = search_variant(job)
    choice = choose_cap(job, variant, steps)
    job, kinds = choose_kind_caps(with_cap(job, choice.cap), variant, steps)
    return job, [choice.line()] + [k.line() for k in kinds]
