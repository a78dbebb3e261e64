"""ServingPlan: the stages, bits and micro-batches a serving job should use, and what they are predicted to give."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from qsync_opt.spec.load import load_plan_file, save_plan_file

SERVING_PLAN_VERSION = 1
_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class _M(BaseModel):
    model_config = _CONFIG


class Stage(_M):
    position: int
    device: str
    """Pipeline device, 'group[index]'."""
    device_type: str
    layers: tuple[int, int]
    """Decoder layers [first, last) on this device."""
    bits: list[int]
    """Bit-width of each of those layers, in order."""
    prefill_ms: float
    """One prefill micro-batch through this stage."""
    decode_ms: float
    """One decode step of one micro-batch through this stage."""
    memory_gb: float
    capacity_gb: float
    cost_source: str = "roofline"
    """'roofline' (device catalog) or 'measured' (timed on this machine): where the stage's times come from."""

    @property
    def bit_counts(self) -> dict[int, int]:
        return {b: self.bits.count(b) for b in sorted(set(self.bits), reverse=True)}


class Prediction(_M):
    prefill_ms: float
    decode_ms: float
    e2e_ms: float
    tokens_per_s: float
    quality: float
    """Σω over layers (0 = every layer at FP16)."""


class BaselineResult(_M):
    name: str
    fits: bool
    prediction: Prediction | None = None
    stages: list[Stage] = Field(default_factory=list)
    prefill_micro_batch: int | None = None
    decode_micro_batch: int | None = None
    solve_s: float = 0.0
    """Time spent searching this baseline over the candidates."""
    note: str = ""


class SolverStats(_M):
    backend: str
    status: str
    """optimal: proven within rel_gap over every enumerated order and micro-batch pair; feasible: a plan, gap open."""
    objective_ms: float
    bound_ms: float | None
    gap: float | None
    rel_gap: float
    wall_s: float
    programs: int
    """Integer programs solved (of device orders × prefill × decode micro-batch sizes)."""
    pruned: int = 0
    """Candidates skipped because a closed-form lower bound showed they cannot beat the plan."""
    statuses: dict[str, int]
    form: str
    """'aggregated' (identical layers: counts per stage and bit) or 'per-layer'."""
    variables: int
    constraints: int


class ServingPlan(_M):
    version: int = SERVING_PLAN_VERSION
    kind: str = "serving"
    name: str
    model: str
    spec_digest: str
    workload: dict[str, int]
    stages: list[Stage]
    prefill_micro_batch: int
    decode_micro_batch: int
    prediction: Prediction
    quality_bound: float | None
    quality_source: str
    cost_source: str
    solver: SolverStats
    baselines: list[BaselineResult]
    notes: list[str] = Field(default_factory=list)

    @property
    def meets_bounds(self) -> bool:
        """Every stage within its memory capacity and the quality within its hard bound, as
        recomputed from the plan's own figures (the CLI's --strict reads this, as for training)."""
        fits = all(s.memory_gb <= s.capacity_gb * (1 + 1e-9) for s in self.stages)
        quality_ok = self.quality_bound is None or self.prediction.quality <= self.quality_bound * (1 + 1e-9)
        return fits and quality_ok

    def best_baseline(self) -> BaselineResult | None:
        fit = [b for b in self.baselines if b.fits and b.prediction is not None]
        return max(fit, key=lambda b: b.prediction.tokens_per_s) if fit else None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2)

    def save(self, path: "str | Path") -> Path:
        """Write the plan atomically: YAML for a .yaml/.yml path, else JSON."""
        return save_plan_file(self.model_dump(mode="json"), path)

    @classmethod
    def load(cls, path: "str | Path") -> "ServingPlan":
        """Read a plan `save` wrote; SpecError naming the file when it is not one."""
        return load_plan_file(cls, path, "serving")
