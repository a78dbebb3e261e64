"""The simulator's records: worker states, the policy variants, and per-trajectory and per-worker
bookkeeping (rollout.simulate's discrete-event model keeps its state in these)."""

from __future__ import annotations

from typing import NamedTuple

GEN, IDLE, SYNC, MIGRATE = "generating", "idle", "syncing", "migrating"
STATES = (GEN, IDLE, SYNC, MIGRATE)
VARIANTS = ("sync", "one-step-off", "stale", "partial-rollout", "trajectory-async", "repack-best-fit", "repack-program")
"""Policy variants compared side by side (the last two: trajectory-async with that repack)."""


def variant_of(job) -> str:
    """The variant a rollout spec asks for: its policy, or repack-<method> for trajectory-async with a repack."""
    p = job.rollout.policy.kind
    if p == "trajectory-async" and job.rollout.repack.method != "none":
        return f"repack-{job.rollout.repack.method}"
    return p


ADMIT, FIRST, FINISH, STEP_START, STEP_END = range(5)
"""Columns of the simulator's per-trajectory times (`Simulator.times`, seconds, NaN until it happens): admitted under
the rule, first placed on a worker (its prefill follows), finished, its trainer step started, that step ended."""


class Finish(NamedTuple):
    """A worker's heap entry: trajectory `tid` ends at the worker's decode step `step` unless it leaves first (an
    entry whose `stint` is not the trajectory's current one is stale)."""

    step: int
    stint: int
    tid: int


class Chunk(NamedTuple):
    """A worker's decode chunk: `n` steps of `dt` seconds each from `t0`."""

    t0: float
    dt: float
    n: int


class SimTraj:
    __slots__ = ("gen_base", "id", "prompt", "round", "start_step", "stint", "target", "version", "worker")

    def __init__(self, tid, prompt, target, rnd):
        self.id, self.prompt, self.target, self.round = tid, prompt, target, rnd
        self.version = None
        self.gen_base = 0
        self.start_step = 0
        self.worker = None
        self.stint = 0


class SimWorker:
    def __init__(self, idx, costs, label):
        self.idx, self.c, self.label = idx, costs, label
        self.cap = 0  # the most it decodes together: rollout.repack.batch_cap or its kind's own (set by the simulator)
        self.version = 0
        self.steps = 0
        self.batch: dict[int, SimTraj] = {}
        self.heap: list[Finish] = []
        self.c0 = 0.0  # Σ (prompt + gen_base − start_step): ΣL at step k = c0 + B·k
        self.reserved = 0.0
        self.epoch = 0
        self.chunk: Chunk | None = None
        self.trip_s = 0.0  # of the chunk's dt per step: the driver's round trip (shared host), not generating
        self.paused_until = -1.0
        self.state, self.since = IDLE, 0.0
        self.totals = {s: 0.0 for s in STATES}
        self.segments: list = []
        self.pulling = False
        self.pull_to = 0

    def total_ctx(self, k=None) -> float:
        return self.c0 + len(self.batch) * (self.steps if k is None else k)


class TrainStep:
    """A trainer step in progress on a shared host (processor sharing): `done` of it by `since`, at the rate
    1 / train_s(tokens, beside) since then; `start` for the trainer's busy time."""

    __slots__ = ("beside", "done", "since", "start", "tokens")

    def __init__(self, tokens, beside, now):
        self.tokens, self.beside = tokens, beside
        self.done, self.since, self.start = 0.0, now, now
