"""The `kind: loading` job (Omniload as a service): sources of variable-length samples, the ranks that consume
them at unequal speeds, and the balancer that splits every global batch over those ranks.

The sources are the data plane's own `SourceSpec`s (the format of a training spec's `data.sources`); the ranks
are given by a relative speed on one shared per-sample cost curve (`cost`), or each by its own curve, both in
seconds per sample, so every predicted figure is a time. `LoadingJob.mix()` is the same job as the data plane's
`MixSpec`, which `qsync_opt.loading.engine.open_engine` reads.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from qsync_opt.data.sources import MixSpec, SourceSpec
from qsync_opt.hardware.device import find_device
from qsync_opt.loading.cost import CostModel
from qsync_opt.spec.base import SpecModel

MAX_GLOBAL_BATCH = 1_000_000
"""Most samples in one global batch (the balancer holds each one's cost on every rank class)."""
MAX_PLANNED_SAMPLES = 1_000_000
"""Most samples `solve` splits, planned steps x global batch (each step is balanced in turn)."""


class SampleCost(SpecModel):
    """Seconds to consume one sample of L tokens: c(L) = c0 + a·L + b·L² (a fit of measured forward+backward
    times, `qsync_opt.loading.cost.fit`, gives these coefficients)."""

    c0: float = Field(default=0.0, ge=0)
    """Seconds per sample, whatever its length (kernel launches, the optimizer's share)."""
    a: float = Field(default=0.0, ge=0)
    """Seconds per token (the linear layers)."""
    b: float = Field(default=0.0, ge=0)
    """Seconds per token squared (attention)."""

    @model_validator(mode="after")
    def _some_cost(self) -> SampleCost:
        if not (self.c0 > 0 or self.a > 0 or self.b > 0):
            raise ValueError("c0, a and b are all 0: a sample would cost nothing; give at least one of them > 0")
        for name in ("c0", "a", "b"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number of seconds")
        return self

    def model(self, speed: float = 1.0) -> CostModel:
        """The data plane's cost curve, in seconds, on a rank of relative `speed` (the curve divided by it)."""
        return CostModel(a=self.a / speed, b=self.b / speed, c0=self.c0 / speed, unit="s")


class Rank(SpecModel):
    """One consumer of the data plane (a data-parallel rank): a relative speed on the shared `cost` curve, or
    its own cost curve."""

    name: str = Field(min_length=1)
    """Label of the rank, unique in ranks (the plan's rows and served.csv use it)."""
    speed: float | None = Field(default=None, gt=0)
    """Relative throughput on the shared `cost` curve: a sample costs this rank cost(L)/speed seconds (1.0 the
    rank `cost` was measured on, 0.5 one twice as slow)."""
    cost: SampleCost | None = None
    """This rank's own seconds per sample, instead of a speed (a curve fitted on this rank)."""
    device: str | None = None
    """The rank's device, a name from the device catalog (hardware/catalog.yaml), for the reader: the plan
    lists it; the speed or cost curve is what the balancer uses."""

    @field_validator("device")
    @classmethod
    def _known_device(cls, v):
        if v is None:
            return v
        try:
            return find_device(v).name
        except KeyError as e:
            raise ValueError(str(e.args[0])) from None

    @model_validator(mode="after")
    def _speed_or_cost(self) -> Rank:
        if (self.speed is None) == (self.cost is None):
            raise ValueError(f"rank {self.name!r}: give exactly one of speed (on the shared cost curve) or cost "
                             "(this rank's own c0, a, b in seconds)")
        return self


class Balancer(SpecModel):
    """How each global batch is split over the ranks (the data plane's balancer)."""

    policy: Literal["none", "tokens", "attention"] = "attention"
    """'none': equal counts in order, as torch's DistributedSampler; 'tokens': equal Σ L/speed; 'attention':
    equal predicted seconds, Σ c_r(L) per rank (the ranks' cost curves)."""
    backend: Literal["cpsat", "highs", "cbc", "scip"] | None = "cpsat"
    """The exact program's solver, after the heuristics (LPT, Karmarkar-Karp, local search); null: heuristics
    only."""
    time_limit_ms: float = Field(default=1000.0, gt=0)
    """Wall-clock limit of one global batch's optional stages (MULTIFIT, the wide local search, the exact
    program); LPT and the fast local search always run. When it fires the best split so far stands."""
    work_limit: float = Field(default=0.02, gt=0)
    """Work budget of the exact program per global batch in CP-SAT's deterministic seconds (backend cpsat): the
    same split on every run, whatever the machine's load."""
    min_gain_ms: float = Field(default=10.0, ge=0)
    """The exact program runs only when it could shorten the slowest rank's predicted step by more than this;
    0 runs it whenever the heuristic is not proven within 1% of the lower bound."""
    token_cap: int | None = Field(default=None, ge=1)
    """Most tokens one rank may take in one step (its memory)."""
    equal_counts: bool = False
    """Give every rank the same number of samples (within one)."""
    prefetch: bool = False
    """Plan step t+1's split on a background thread while step t is served, so that only what is left of it
    stays on the critical path (served.csv: plan_s and wait_s per step). `solve` plans inline."""


class LoadingJob(SpecModel):
    """A data-loading job: sources mixed by weight into global batches, split over ranks of unequal speed."""

    kind: Literal["loading"] = "loading"
    """The problem kind (every loading spec says so: a spec without `kind:` is a training spec)."""
    name: str = Field(default="loading", min_length=1)
    """Label of the job (the report's title)."""
    sources: list[SourceSpec] = Field(min_length=1)
    """Datasets of variable-length samples mixed by weight (the data plane's sources, as a training spec's
    data.sources)."""
    cost: SampleCost | None = None
    """Seconds per sample of L tokens on a rank of speed 1.0: the curve of every rank given by a speed
    (required when one is)."""
    ranks: list[Rank] = Field(min_length=1)
    """The consumers, in rank order."""
    global_batch: int = Field(ge=1, le=MAX_GLOBAL_BATCH)
    """Samples per step, over all ranks."""
    steps: int = Field(default=10, ge=1)
    """Global batches `run` serves (`run --steps` overrides it)."""
    horizon: int | None = Field(default=None, ge=1)
    """Steps `solve` plans, the first of `steps` (default: all of them)."""
    seed: int = Field(default=0, ge=0)
    """Seed of the per-source shuffles and the per-step shuffle of the mix."""
    max_step_ms: float | None = Field(default=None, gt=0)
    """A bound: the slowest rank's predicted time in every planned step at most this (the plan says whether
    it is met; `solve --strict` exits 5 when not)."""
    balancer: Balancer = Field(default_factory=Balancer)
    """The balancer's settings."""
    engine: Literal["inprocess", "ray"] = "inprocess"
    """Where `run` reads the samples: 'inprocess' (the coordinator and the sources in this process) or 'ray'
    (a loader actor per source and a coordinator actor; needs the ray extra). `solve` plans in process: both
    give the same sample sequence."""
    shadow: bool = False
    """Give every source's loader a standby: when the loader dies (raises; on Ray, its actor is killed) or stalls
    past stall_timeout_s, the standby takes over from the plane's recorded state, and the step's samples arrive
    with none lost or repeated (served.csv and report.md list the takeovers)."""
    stall_timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Seconds a loader may take to answer one read before it counts as stalled: its standby takes over
    (shadow: true), or `run` ends naming the source. Default: no deadline."""

    @model_validator(mode="after")
    def _ranks(self) -> LoadingJob:
        names = [r.name for r in self.ranks]
        for i, r in enumerate(self.ranks):
            if names.index(r.name) != i:
                raise ValueError(f"ranks.{i}.name: {r.name!r} is listed twice; rank names must be unique")
        planned = self.planned_steps * self.global_batch
        if planned > MAX_PLANNED_SAMPLES:
            what = "horizon" if self.horizon is not None and self.horizon < self.steps else "steps"
            raise ValueError(f"{what} x global_batch = {planned:,} samples to plan, more than {MAX_PLANNED_SAMPLES:,}; "
                             f"lower {what}{'' if what == 'horizon' else ' or set horizon (the steps solve plans)'}")
        by_speed = [i for i, r in enumerate(self.ranks) if r.speed is not None]
        if by_speed and self.cost is None:
            raise ValueError(f"ranks.{by_speed[0]}.speed: a rank given by speed needs the shared curve `cost` "
                             "(c0, a, b: seconds per sample on a rank of speed 1.0); give cost, or a cost per rank")
        names = [s.name for s in self.sources]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"sources: names must be unique, {dup} repeat")
        try:
            self.mix()  # the data plane's own rules on the sources (a weight at every step, ray installed)
        except ValidationError as e:
            raise ValueError("; ".join(err["msg"].removeprefix("Value error, ").replace("data.", "")
                                       for err in e.errors())) from None
        return self

    @property
    def planned_steps(self) -> int:
        """Steps `solve` plans: `horizon`, at most `steps`."""
        return min(self.steps, self.horizon or self.steps)

    def mix(self) -> MixSpec:
        """This job as the data plane's `MixSpec` (what `open_engine` reads)."""
        b = self.balancer
        return MixSpec(sources=self.sources, balance=b.policy, token_cap=b.token_cap, equal_counts=b.equal_counts,
                       engine=self.engine, plan_work_limit=b.work_limit, plan_time_limit_ms=b.time_limit_ms,
                       plan_min_gain_ms=b.min_gain_ms, mix_seed=self.seed, prefetch=b.prefetch, shadow=self.shadow,
                       stall_timeout_s=self.stall_timeout_s)

    @property
    def by_speed(self) -> bool:
        """Whether every rank is given by a speed (the data plane then divides one curve by each)."""
        return all(r.speed is not None for r in self.ranks)

    def plane_cost(self) -> CostModel | list[CostModel]:
        """The cost the data plane takes: the shared curve when every rank is given by a speed, else one curve
        per rank (`rank_costs`)."""
        return self.cost.model() if self.by_speed else self.rank_costs()

    def rank_costs(self) -> list[CostModel]:
        """Every rank's seconds per sample c_r(L), in rank order."""
        return [r.cost.model() if r.cost is not None else self.cost.model(r.speed) for r in self.ranks]
