"""Plan: the planner's answer, keyed by operator FQN, with every predicted figure beside it.

A plan is what a scheduler stores and what the runtime applies: per device group, a map
FQN -> precision (in the style of torchao's FqnToConfig), the local batch, and the
predicted time and memory that justify it, plus how it was solved and from which spec.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from qsync_opt.errors import SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.precision import PrecisionName

FORMAT_VERSION = 1

_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class GroupPlan(BaseModel):
    model_config = _CONFIG

    device: str
    count: int
    local_batch: int
    precisions: dict[str, PrecisionName]
    """Operator FQN -> precision, in graph order."""
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
    cost_source: Literal["roofline", "measured"] = "roofline"

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


class Provenance(BaseModel):
    model_config = _CONFIG

    spec_digest: str
    versions: dict[str, str]
    created: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))


class GraphFingerprint(BaseModel):
    """What model a plan was solved for: each selectable operator's name, kind and weight shape.

    `apply_plan` compares it with the module it is given, so a plan never lands on another
    model whose operator names merely overlap.
    """

    model_config = _CONFIG

    digest: str
    """SHA-256 (16 hex digits) over `ops`, for a quick equality check."""
    ops: dict[str, str]
    """Operator FQN -> 'kind[weight shape]', e.g. 'conv2d[16,3,3,3]', in graph order."""


_FUNCTIONAL_OP = re.compile(r"(^|\.)[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*_\d+$")
"""Names the tracer gives functional ops (`<parent>.<fn>_<k>`): they have no module to compare."""


def op_signature(kind: str, weight_shape) -> str:
    return f"{kind}[{','.join(str(int(d)) for d in (weight_shape or ()))}]"


def make_fingerprint(ops: dict[str, str]) -> GraphFingerprint:
    blob = json.dumps(sorted(ops.items())).encode()
    return GraphFingerprint(digest=hashlib.sha256(blob).hexdigest()[:16], ops=dict(ops))


def graph_fingerprint(graph) -> GraphFingerprint:
    """The fingerprint of a traced OpGraph: its selectable operators with their weight shapes."""
    return make_fingerprint({n.name: op_signature(n.kind, n.weight_shape) for n in graph.nodes if n.selectable})


_GEMM_KINDS = {"matmul", "bmm"}


def _stand_in_for(module_sig: str, plan_sig: str) -> bool:
    """A module that holds no weight of its own (the weight arrives as an argument, as in the
    modules `models.rewrite` puts in place of a functional call) can only be checked by kind;
    torch.matmul and torch.bmm both become a MatMul."""
    if not module_sig.endswith("[]"):
        return False
    have, want = module_sig.split("[")[0], plan_sig.split("[")[0]
    return have == want or {have, want} <= _GEMM_KINDS


def fingerprint_mismatch(want: GraphFingerprint, have: dict[str, str]) -> str | None:
    """The first difference between a plan's fingerprint and a module's module ops, or None.

    `have` holds the module's swappable modules (FQN -> signature); the plan's functional ops
    (no module of their own) are compared only by absence from `have`.
    """
    if make_fingerprint(have).digest == want.digest:
        return None
    for name, sig in want.ops.items():
        if name in have and have[name] != sig and not _stand_in_for(have[name], sig):
            return f"operator {name!r} is {have[name]} in the model but {sig} in the plan"
    for name, sig in have.items():
        if name not in want.ops:
            return f"operator {name!r} ({sig}) is in the model but not in the plan's graph"
    missing = [n for n in want.ops if n not in have and not _FUNCTIONAL_OP.search(n)]
    if missing:
        return f"operator {missing[0]!r} ({want.ops[missing[0]]}) of the plan's graph is not in the model"
    return None


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
    fingerprint: GraphFingerprint | None = None
    """The traced graph the plan was solved for; None in hand-written plans (then not checked)."""

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
        if not path.exists():
            raise SpecError(f"plan file {str(path)!r} does not exist")
        try:
            text = path.read_text()
            data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
        except (ValueError, yaml.YAMLError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise SpecError(f"plan file {str(path)!r} cannot be read ({type(e).__name__}: {e}); it may be "
                            "truncated or corrupted: write it again with `qsync-opt solve SPEC -o FILE`") from None
        if not isinstance(data, dict):
            raise SpecError(f"plan file {str(path)!r} holds a {type(data).__name__}, not a plan mapping; "
                            "write it again with `qsync-opt solve SPEC -o FILE`")
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
