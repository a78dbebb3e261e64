"""Plan: the planner's answer, keyed by operator FQN, with every predicted figure beside it.

A plan is what a scheduler stores and what the runtime applies: per device group, a map
FQN -> precision (in the style of torchao's FqnToConfig), the local batch, and the
predicted time and memory that justify it, plus how it was solved and from which spec.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_serializer

from qsync_opt.errors import SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.models.fingerprint import (  # noqa: F401 (re-exported: plans carry the graph's fingerprint)
    GraphFingerprint, fingerprint_mismatch, graph_fingerprint, make_fingerprint, op_signature)
from qsync_opt.precision import PrecisionName
from qsync_opt.spec.load import plan_kind, read_text_file

FORMAT_VERSION = 1

_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class GroupPlan(BaseModel):
    model_config = _CONFIG

    device: str
    count: int
    local_batch: int
    precisions: dict[str, PrecisionName]
    """Operator FQN -> precision, in graph order."""
    kernels: dict[str, Literal["auto", "templated", "torch"]] = {}
    """Operator FQN -> the implementation its group's profile measured faster at its precision (under
    runtime.kernels: auto; training/predictor/measured_dispatch.py), which the trainer runs and the plan's
    times price; operators not named run runtime.kernels."""
    compute_ms: float
    """Forward + backward + casts + optimizer, per iteration."""
    comm_exposed_ms: float
    """Part of the gradient all-reduce not hidden behind backward."""
    iteration_ms: float
    """compute_ms + comm_exposed_ms: this group's synchronous step time."""
    time_bound_ms: float | None = None
    peak_memory_bytes: float
    memory_capacity_bytes: float
    indicator: float
    """Σ ω over this group's operators at their precisions (unweighted)."""
    cost_source: Literal["measured", "calibrated", "datasheet", "roofline"] = "datasheet"
    """Where the op times come from: 'measured' (a profile of the device), 'calibrated' (datasheet
    roofline with efficiency factors measured on this architecture) or 'datasheet' (roofline from the
    catalog alone); the plan's notes name the files. 'roofline': plans written before calibration,
    datasheet only."""

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.precisions.values():
            out[p] = out.get(p, 0) + 1
        return out


class SolverReport(BaseModel):
    model_config = _CONFIG

    backend: str
    status: Literal["optimal", "feasible", "infeasible", "error", "heuristic"]
    """As reported by the solver itself; 'heuristic' for greedy/uniform policies."""
    objective: float
    best_bound: float | None = None
    gap: float | None = None
    wall_s: float
    refine_rounds: int = 0
    build_s: float = 0.0
    """Seconds spent building models (not bounded by time_limit_s; a solver cannot stop inside it)."""
    solve_s: float = 0.0
    """Seconds spent in solvers, shared by every round: at most time_limit_s (plus one solver's overshoot)."""
    notes: list[str] = Field(default_factory=list)


class Baseline(BaseModel):
    model_config = _CONFIG

    iteration_ms: float
    """Synchronous iteration time (slowest group)."""
    indicator: float
    """Share-weighted indicator sum: the scale of Plan.indicator."""
    peak_memory_bytes: dict[str, float]
    feasible: bool
    """Meets every time and memory bound of the instance."""
    precisions: dict[str, dict[str, PrecisionName]] = Field(default_factory=dict)
    """Group -> operator FQN -> precision: the baseline as a plan that can be trained."""
    group_indicator: dict[str, float] = Field(default_factory=dict)
    """Per group Σ ω (unweighted): the scale of GroupPlan.indicator."""
    local_batches: dict[str, int] = Field(default_factory=dict)
    """Per-device batch of each group under this baseline."""


class DataPlaneGroup(BaseModel):
    model_config = _CONFIG

    speed: float
    """Relative speed (the fastest group 1.0), from this group's plan."""
    seconds_per_flop: float
    c0: float
    a: float
    b: float
    """c_g(L) = c0 + a·L + b·L² seconds per sample of L tokens on one rank of this group."""


class DataPlanePlan(BaseModel):
    """With data.sources: how the data plane balances samples over ranks and feeds the mix."""

    model_config = _CONFIG

    policy: str
    """Balancer policy: 'ours' (Σ c_g(L) per rank), 'tokens' or 'stride'."""
    balance: str
    """data.balance as resolved (none | tokens | attention)."""
    reference_length: int
    """Tokens per sample the plan's compute_ms was predicted at (the traced length)."""
    flops_a: float
    flops_b: float
    """FLOPs(L) = flops_a·L + flops_b·L² of forward+backward of one sample."""
    speeds_from: str
    groups: dict[str, DataPlaneGroup]
    loader_cpus: int
    loader_workers: dict[str, int]
    """Loader workers per source within loader_cpus (the integer program of loading.sizing)."""
    preprocess_ms: dict[str, float]
    """Measured CPU time to read and preprocess one sample, per source."""
    demand_samples_per_s: dict[str, float]
    supply_ratio: float
    """min over sources of supply / demand at these worker counts (>= 1: no source starves the mix)."""
    sizing_status: str
    notes: list[str] = Field(default_factory=list)


class Provenance(BaseModel):
    model_config = _CONFIG

    spec_digest: str
    versions: dict[str, str]
    created: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))


class Plan(BaseModel):
    model_config = _CONFIG

    format_version: int = FORMAT_VERSION
    job: str
    model: str
    objective: Literal["accuracy_degradation", "iteration_time"]
    groups: dict[str, GroupPlan]
    iteration_ms: float
    """Predicted synchronous iteration time: the slowest group's."""
    indicator: float
    """Σ_g share_g · indicator_g: the accuracy-degradation estimate that was minimised."""
    solver: SolverReport
    meets_bounds: bool = True
    """False when no plan found meets every bound by the replayer's timeline: this is then the
    closest one, and `qsync-opt solve --strict` exits non-zero."""
    baselines: dict[str, Baseline] = Field(default_factory=dict)
    provenance: Provenance
    boundary: Literal["edge", "fp32"] = "fp32"
    """The runtime.boundary the plan was costed for; the runtime refuses a plan made for another."""
    backward_precision: Literal["bf16", "fp16", "fp32", "fp8"] | None = None
    """The runtime.backward_precision the plan was costed for; training refuses it under another (None: a plan
    written by hand or before plans recorded it, not checked)."""
    fingerprint: GraphFingerprint | None = None
    """The traced graph the plan was solved for; None in hand-written plans (then not checked)."""
    indicator_used: str = ""
    """Which indicator made ω and on what weights and data, e.g. 'indicator: empirical on weights
    trained 400 fp32 steps on the job's data (auto; cached ...)'; empty in hand-written plans."""
    data_plane: DataPlanePlan | None = None
    """With data.sources: rank speeds and cost curves from the groups' plans, and the loader
    workers per source (left out of the file when absent, so other plans read as before)."""

    @model_serializer(mode="wrap")
    def _omit_empty_data_plane(self, handler):
        out = handler(self)
        if isinstance(out, dict) and out.get("data_plane", 0) is None:
            del out["data_plane"]
        return out

    # --- views ---------------------------------------------------------------------------
    def to_fqn_config(self, group: str) -> dict[str, str]:
        """Plain FQN -> precision map for one group (torchao FqnToConfig style)."""
        return dict(self.group(group).precisions)

    def group(self, name: str) -> GroupPlan:
        if name not in self.groups:
            raise SpecError(f"plan has no group {name!r}; groups: {', '.join(self.groups)}")
        return self.groups[name]

    # --- files ---------------------------------------------------------------------------
    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def save(self, path: "str | Path") -> Path:
        """Write JSON or YAML (by suffix) atomically."""
        path = Path(path)
        text = self.to_yaml() if path.suffix in (".yaml", ".yml") else self.to_json()
        return atomic_write_text(path, text)

    @classmethod
    def load(cls, path: "str | Path") -> "Plan":
        path = Path(path)
        text = read_text_file(path, "plan file", "a plan written by `qsync-opt solve SPEC -o plan.json`")
        try:
            data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
        except (ValueError, yaml.YAMLError) as e:  # JSONDecodeError is a ValueError
            raise SpecError(f"plan file {str(path)!r} cannot be read ({type(e).__name__}: {e}); it may be "
                            "truncated or corrupted: write it again with `qsync-opt solve SPEC -o FILE`") from None
        if not isinstance(data, dict):
            raise SpecError(f"plan file {str(path)!r} holds a {type(data).__name__}, not a plan mapping; "
                            "write it again with `qsync-opt solve SPEC -o FILE`")
        kind = plan_kind(data)
        if kind not in (None, "training"):
            raise SpecError(f"plan file {str(path)!r} is a {kind} plan; train and predict take a training plan "
                            "(`qsync-opt solve TRAINING_SPEC -o plan.json`)")
        if kind is None and "format_version" not in data and ("cluster" in data or "kind" in data):
            raise SpecError(f"plan file {str(path)!r} is a job spec, not a plan; give the spec as SPEC and its plan "
                            f"as --plan (make one with `qsync-opt solve {path} -o plan.json`)")
        return cls.from_dict(data, origin=str(path))

    @classmethod
    def from_dict(cls, data: dict, origin: str = "<plan>") -> "Plan":
        if isinstance(data, dict) and "boundary" not in data:  # written before plans recorded it, when
            data = {**data, "boundary": "edge"}                # every plan was costed for 'edge'
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise SpecError(f"{origin}: plan format_version {version!r} is not supported (expected {FORMAT_VERSION})")
        try:
            return cls.model_validate(data)
        except Exception as e:  # pydantic.ValidationError: keep the field paths, drop the traceback
            raise SpecError(f"{origin}: invalid plan: {e}") from None
