"""The spec's `data.sources` (Omniload's declarative data plane): several datasets of
variable-length samples, each with a weight or a piecewise-linear weight schedule over steps.

Torch-free like the rest of `data/config.py`: validated at spec load. `qsync_opt.loading`
turns these into source indexes and the coordinator that mixes and balances them.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, populate_by_name=True)

BUILTIN_SOURCES = ("synthetic-lm", "pysource-lm")


class SourceSpec(BaseModel):
    """One dataset of the mix."""

    model_config = _CONFIG

    name: str = Field(min_length=1)
    """Label of the source, unique in data.sources (reports, checkpoints and errors use it)."""
    builtin: Literal["synthetic-lm", "pysource-lm"] | None = None
    """'synthetic-lm': token sequences generated locally with log-normal lengths; kwargs:
    num_samples, median, sigma, min_len, max_len, vocab, seed. 'pysource-lm': the training
    files of data set 'pysource' (the Python standard library's own sources, bytes as tokens,
    vocabulary 256) cut into consecutive pieces of log-normal lengths; kwargs: median, sigma,
    min_len, max_len, train_bytes (1,000,000), skip_bytes (0: where in the text this source
    starts, so that two sources read different text), seed."""
    import_: str | None = Field(default=None, alias="import")
    """'pkg.module:factory' returning a dataset whose item i is a 1-D tensor of token ids."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the factory or options of the built-in source."""
    lengths: list[int] | str | None = None
    """Tokens per sample (import sources only, required there): a list, a .npy or .txt file
    (one integer a line), or 'from_source' to read the dataset's `lengths` attribute."""
    weight: float | None = None
    """Share of the mix (relative to the other sources' weights); default 1 without a schedule."""
    schedule: list[tuple[int, float]] | None = None
    """Curriculum: [[step, weight], ...] with increasing steps; piecewise linear between the
    points, constant before the first and after the last."""

    @field_validator("weight")
    @classmethod
    def _weight(cls, v):
        if v is not None and not v >= 0:
            raise ValueError(f"weight must be >= 0, got {v}; give a non-negative share")
        return v

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v):
        if v is None:
            return v
        if not v:
            raise ValueError("schedule is empty; give [[step, weight], ...] or use weight")
        for (s0, _), (s1, _) in zip(v, v[1:]):
            if s1 <= s0:
                raise ValueError(f"schedule steps must increase, but step {s1} follows step {s0}; "
                                 "list the points in step order")
        for s, w in v:
            if s < 0 or not w >= 0:
                raise ValueError(f"schedule point [{s}, {w}]: steps and weights must be >= 0")
        return v

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("lengths is empty; give one token count per sample")
            bad = next((x for x in v if x <= 0), None)
            if bad is not None:
                raise ValueError(f"lengths must be positive token counts, found {bad}")
        elif isinstance(v, str) and v != "from_source" and not v.endswith((".npy", ".txt")):
            raise ValueError(f"lengths {v!r}: give a list, a .npy/.txt file or 'from_source'")
        return v

    @model_validator(mode="after")
    def _kind(self) -> SourceSpec:
        if (self.builtin is None) == (self.import_ is None):
            raise ValueError(f"source {self.name!r}: give exactly one of builtin ({', '.join(BUILTIN_SOURCES)}) "
                             "or import ('pkg.module:factory')")
        if self.import_ is not None and (self.import_.count(":") != 1 or not all(self.import_.split(":"))):
            raise ValueError(f"source {self.name!r}: import must look like 'pkg.module:factory', got {self.import_!r}")
        if self.import_ is not None and self.lengths is None:
            raise ValueError(f"source {self.name!r}: lengths is required for an import source (the balancer needs "
                             "every sample's token count before it is read); give a list, a .npy/.txt file, or "
                             "'from_source' if the dataset has a `lengths` attribute")
        if self.builtin is not None and self.lengths is not None:
            raise ValueError(f"source {self.name!r}: a builtin source makes its own lengths; drop lengths "
                             "(set kwargs instead)")
        if self.weight is not None and self.schedule is not None:
            raise ValueError(f"source {self.name!r}: give weight or schedule, not both")
        return self

    def weight_at(self, step: int) -> float:
        if self.schedule is None:
            return 1.0 if self.weight is None else float(self.weight)
        return piecewise(self.schedule, step)

    def breakpoints(self) -> list[int]:
        return [s for s, _ in self.schedule] if self.schedule else [0]


def piecewise(points, step: float) -> float:
    """Piecewise-linear value of [(step, weight), ...] at `step`, constant outside."""
    if step <= points[0][0]:
        return float(points[0][1])
    for (s0, w0), (s1, w1) in zip(points, points[1:]):
        if step <= s1:
            return float(w0 + (w1 - w0) * (step - s0) / (s1 - s0))
    return float(points[-1][1])


class MixSpec(BaseModel):
    """The data-plane fields of `data:`; mixed into DataSpec (all optional: a spec without
    them trains exactly as before)."""

    model_config = _CONFIG

    sources: list[SourceSpec] | None = None
    """Datasets of variable-length samples mixed by weight (Omniload's data plane)."""
    balance: Literal["none", "tokens", "attention"] | None = None
    """How a global batch is split over data-parallel ranks: 'none' (equal counts in order,
    as DistributedSampler), 'tokens' (equal Σ L/speed), 'attention' (equal Σ c(L)/speed with
    c(L) = a·L + b·L²; the default when sources are given)."""
    token_cap: int | None = Field(default=None, ge=1)
    """Most tokens one rank may take in one step (memory)."""
    equal_counts: bool = False
    """Give every rank the same number of samples (within one)."""
    engine: Literal["inprocess", "ray"] = "inprocess"
    """'inprocess': the coordinator lives in the trainer's process; 'ray': source loaders and the
    coordinator run as Ray actors (needs the ray extra)."""
    plan_work_limit: float = Field(default=0.02, gt=0)
    """Work budget of the exact balancing program per global batch, in CP-SAT's deterministic
    seconds (one thread): the same split on every run, whatever the machine's load."""
    plan_time_limit_ms: float = Field(default=1000.0, gt=0)
    """Wall-clock limit of one balance call's optional stages (MULTIFIT, the wide local search, the
    exact program with its model building); LPT and the fast local search always run, so the split
    is reproducible. When it fires the best split found so far stands."""
    plan_min_gain_ms: float = Field(default=10.0, ge=0)
    """The exact program runs only when it could shorten the slowest rank's predicted step by more
    than this (the heuristic split's slowest rank less the lower bound), i.e. when it can win back
    what it costs on the critical path; applies when the ranks' cost curves are in seconds (from
    the plan). 0 runs it whenever the heuristic is not proven within 1%."""
    mix_seed: int = 0
    """Seed of the per-source shuffles."""
    loader_cpus: int | None = Field(default=None, ge=1)
    """CPU budget of the source loaders: the plan picks how many loader workers each source
    gets within it so that no source starves the mix (default: this machine's CPU count)."""
    checkpoint_full_every: int = Field(default=8, ge=1)
    """The data plane's state goes into every training checkpoint; whole every N-th time, in
    between only what changed since the last whole one."""
    prefetch: bool = False
    """Plan step t+1's split on a background thread while step t runs, so that only what is left
    of it stays on the step's critical path (each step reports plan_s and wait_s)."""
    shadow: bool = False
    """Give every source loader a standby, opened beside it: when the loader dies (raises, or its
    Ray actor is killed) or stalls past stall_timeout_s, the standby takes over from the data
    plane's last checkpointed state and the step's samples arrive, none lost or repeated."""
    stall_timeout_s: float | None = Field(default=None, gt=0)
    """Seconds a loader may take to return one read before it counts as stalled: its standby takes
    over (shadow: true), or the run ends naming the source (default: no deadline)."""

    @model_validator(mode="after")
    def _mix(self) -> MixSpec:
        src = self.sources
        if src is not None:
            if not src:
                raise ValueError("data.sources is empty; list at least one source or drop the key")
            names = [s.name for s in src]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"data.sources: names must be unique, {dup} repeat")
            steps = sorted({b for s in src for b in s.breakpoints()})
            for t in steps:
                if sum(s.weight_at(t) for s in src) <= 0:
                    raise ValueError(f"data.sources: every weight is zero at step {t}; give at least one source "
                                     "a positive weight there")
        elif self.balance not in (None, "none") or self.token_cap is not None:
            raise ValueError("data.balance and data.token_cap need data.sources (samples with lengths)")
        else:
            loose = [k for k in ("prefetch", "shadow") if getattr(self, k)] + \
                (["stall_timeout_s"] if self.stall_timeout_s is not None else [])
            if loose:
                raise ValueError(f"data.{loose[0]} applies to the data plane's sources, and data.sources is not "
                                 "given; list the sources or drop the key")
        if self.stall_timeout_s is not None and not math.isfinite(self.stall_timeout_s):
            raise ValueError(f"data.stall_timeout_s: {self.stall_timeout_s} is not a number of seconds; give a "
                             "finite deadline > 0, or drop the key for none")
        if self.engine == "ray" and importlib.util.find_spec("ray") is None:
            raise ValueError("data.engine: 'ray' needs the ray package, which is not installed here; "
                             "pip install 'ray>=2.9' (the ray extra), or set data.engine: inprocess")
        return self

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler):
        """Leave the data-plane keys out of a dump while they hold their defaults, so that a
        spec written before they existed dumps, and so digests, exactly as it did."""
        out = handler(self)
        if isinstance(out, dict):
            for name, f in MixSpec.model_fields.items():
                if name in out and getattr(self, name) == f.get_default(call_default_factory=True):
                    del out[name]
        return out

    @property
    def balance_policy(self) -> str:
        if self.balance is not None:
            return self.balance
        return "attention" if self.sources else "none"
