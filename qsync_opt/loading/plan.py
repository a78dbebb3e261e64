"""A loading plan: the data plane's split of the first global batches of a `kind: loading` job, step by step and
rank by rank, against the lower bound and against an even split by count.

Plain records (pydantic), written and read as JSON (or YAML by suffix); `qsync_opt.loading.planner` makes one
from the real data plane, `qsync_opt.loading.report` prints it.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from qsync_opt.spec.load import load_plan_file, save_plan_file

LOADING_PLAN_VERSION = 1
BOUND_TOL = 1e-9
"""Relative slack of `meets_bounds`: the predicted times are sums of floats."""

_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class _Record(BaseModel):
    model_config = _CONFIG


class RankInfo(_Record):
    """One rank as the balancer saw it."""

    name: str
    device: str | None = None
    speed: float
    """Relative speed the balancer used (given, or, for a rank with its own curve, the fastest rank's seconds
    per sample of the mean length over this rank's)."""
    c0: float
    a: float
    b: float
    """The rank's seconds per sample of L tokens: c0 + a·L + b·L²."""


class RankStep(_Record):
    """What one rank gets in one step."""

    samples: int
    tokens: int
    predicted_s: float
    """Σ c_r(L) over its samples."""


class StepSplit(_Record):
    """One global batch: the balancer's split and the two figures it is measured against."""

    step: int
    ranks: list[RankStep]
    makespan_s: float
    """The slowest rank's predicted time: the step's time."""
    bound_s: float
    """A lower bound on the makespan of any split of this batch (the balancer's: area, single-sample and
    counting bounds, or the proven optimum), to the balancer's quantisation (2**-20 of the largest sample)."""
    even_s: float
    """The makespan of an even split by count (sample i to rank i mod K, as torch's DistributedSampler)."""
    even_ranks_s: list[float]
    """Each rank's predicted seconds under that even split."""
    status: str
    """The balancer's: 'optimal' (proven) or 'feasible'."""
    method: str
    """The stage whose split stands (kk, lpt, multifit with +ls/+wide, an exact backend, or stride)."""
    time_limited: bool = False
    """A stage stopped at the per-step time limit (a rerun may split this batch differently)."""

    @property
    def gap(self) -> float:
        """(makespan - bound) / makespan."""
        return max(0.0, self.makespan_s - self.bound_s) / self.makespan_s if self.makespan_s > 0 else 0.0


class Summary(_Record):
    """The planned steps together."""

    steps: int
    step_s: float
    """Mean predicted step time (the makespan)."""
    bound_s: float
    """Mean lower bound."""
    even_s: float
    """Mean step time of the even split by count."""
    gap: float
    """(Σ makespan - Σ bound) / Σ makespan: how far the split may be from the best one."""
    speedup: float
    """Σ even split's makespan / Σ makespan."""
    optimal_steps: int
    """Steps whose split the balancer proved optimal."""
    time_limited_steps: int


class LoadingPlan(_Record):
    """The data plane's plan of a loading job's first `summary.steps` global batches."""

    loading_plan_version: int = LOADING_PLAN_VERSION
    name: str
    policy: str
    """The balancer's policy (none, tokens, attention)."""
    backend: str | None
    global_batch: int
    sources: list[str]
    ranks: list[RankInfo]
    split: list[StepSplit]
    summary: Summary
    max_step_s: float | None = Field(default=None)
    """The spec's bound on every step's predicted time (max_step_ms), if it sets one."""

    @property
    def meets_bounds(self) -> bool | None:
        """None when the spec sets no bound; else whether every planned step's makespan is within max_step_ms."""
        if self.max_step_s is None:
            return None
        return all(s.makespan_s <= self.max_step_s * (1 + BOUND_TOL) for s in self.split)

    def rank_means(self) -> list[RankStep]:
        """Per rank, its mean samples, tokens and predicted time per step (samples and tokens rounded)."""
        n = max(len(self.split), 1)
        out = []
        for r in range(len(self.ranks)):
            got = [s.ranks[r] for s in self.split]
            out.append(RankStep(samples=round(sum(g.samples for g in got) / n),
                                tokens=round(sum(g.tokens for g in got) / n),
                                predicted_s=sum(g.predicted_s for g in got) / n))
        return out

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2)

    def save(self, path: "str | Path") -> Path:
        """Write the plan atomically: YAML for a .yaml/.yml path, else JSON."""
        return save_plan_file(self.model_dump(mode="json"), path)

    @classmethod
    def load(cls, path: "str | Path") -> LoadingPlan:
        """Read a plan `save` wrote; SpecError naming the file when it is not one."""
        return load_plan_file(cls, path, "loading")
