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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def planned_job(job, steps: int | None = None):
    """(the job the plan simulates and runs, the CapChoice or None): `job` itself unless rollout.repack.choose_cap,
    else `job` at choose_cap's cap under search_variant."""
    if not job.rollout.repack.choose_cap:
        return job, None
    choice = choose_cap(job, search_variant(job), steps)
    return with_cap(job, choice.cap), choice
