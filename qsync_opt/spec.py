"""The job spec: what a user or a scheduler declares, validated before any work starts.

`load_spec` accepts a path, a YAML string or a dict. Every error names the field path, the
bad value, the YAML line where it stands and what would be accepted; unknown keys are
errors, so a typo never passes silently.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from qsync_opt.data.config import DataSpec
from qsync_opt.errors import SpecError
from qsync_opt.serving_spec import ServingSpec  # noqa: F401  (the serving section lives beside its planner)
from qsync_opt.spec_base import SpecModel as _Model
from qsync_opt.spec_cluster import INTERCONNECTS, Cluster, DeviceGroup, Interconnect  # noqa: F401 (re-exported)
from qsync_opt.spec_errors import format_errors
from qsync_opt.spec_yaml import CODE_ENV, INT_ENV, DuplicateKey, UniqueKeyLoader, loads_code  # noqa: F401 (re-exported)

#: Solver backends a spec may name: the registry's (qsync_opt.solver.backends.BACKENDS), the
#: uniform-lowest policy, and 'default' (the measured best; see solver.solve.DEFAULT_BACKEND).
BACKEND_NAMES: tuple[str, ...] = ("highs", "cbc", "scip", "cpsat", "greedy", "uniform", "default")


class ModelSpec(_Model):
    """Which network to plan: a zoo name, or a factory in the user's own code."""

    name: str | None = None
    """Zoo model, e.g. 'resnet50' (see `qsync-opt models`)."""
    import_: str | None = Field(default=None, alias="import")
    """'pkg.module:factory' returning an nn.Module; needs input_shape."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the zoo builder or the factory."""
    input_shape: list[int] | None = None
    """Per-sample input shape for an imported model, e.g. [3, 32, 32]."""
    input_dtype: Literal["float32", "int64"] = "float32"
    leaf_modules: list[str] = Field(default_factory=list)
    """Module FQNs or class names that tracing must treat as opaque."""
    checkpoint: str | None = None
    """A trained state_dict (torch.save) to load before computing indicators; random weights say little."""

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        if (self.name is None) == (self.import_ is None):
            raise ValueError("give exactly one of model.name (a zoo model) or model.import ('pkg.module:factory')")
        if self.import_ is not None and self.input_shape is None:
            raise ValueError("an imported model needs model.input_shape (per-sample, e.g. [3, 32, 32])")
        if self.import_ is not None and ":" not in self.import_:
            raise ValueError(f"model.import must look like 'pkg.module:factory', got {self.import_!r}")
        return self


class TrainingSpec(_Model):
    global_batch: int = Field(ge=1)
    """Samples per synchronous iteration, summed over all devices."""
    optimizer: Literal["sgd", "momentum", "adam", "adamw"] = "adamw"
    """Decides optimizer-state memory (0, 1 or 2 FP32 copies of the weights)."""
    lr: float = Field(default=1e-3, gt=0)
    seq_len: int | None = Field(default=None, ge=1)
    """Sequence length for transformer models (default: the zoo model's)."""
    steps: int = Field(default=20, ge=1)
    """Training steps for `qsync-opt train`."""
    batch_split: Literal["fixed", "auto"] = "fixed"
    """'auto' lets the planner choose each group's local batch jointly with precision."""
    seed: int = 0


class Objective(_Model):
    minimize: Literal["accuracy_degradation", "iteration_time"] = "accuracy_degradation"
    max_iteration_time: Union[Literal["auto"], float] = "auto"
    """Bound in ms; 'auto' = the training groups' own time at their own precision (QSync)."""
    max_accuracy_degradation: Union[float, str, None] = None
    """Budget on the share-weighted indicator sum, for minimize: iteration_time: an absolute
    number (>= 0), or a percentage such as "5%" of the uniform-lowest-precision plan's indicator."""

    @field_validator("max_accuracy_degradation")
    @classmethod
    def _budget(cls, v):
        if isinstance(v, str):
            text = v.strip()
            try:
                pct = float(text[:-1]) if text.endswith("%") else None
            except ValueError:
                pct = None
            if pct is None or not 0 <= pct < float("inf"):
                raise ValueError(f"max_accuracy_degradation: {v!r}; give a number >= 0 or a percentage such as '5%'")
            return f"{pct:g}%"
        if v is not None and not v >= 0:
            raise ValueError(f"max_accuracy_degradation: {v!r}; give a number >= 0 or a percentage such as '5%'")
        return v

    @field_validator("max_iteration_time")
    @classmethod
    def _positive(cls, v):
        if v != "auto" and v <= 0:
            raise ValueError("max_iteration_time must be 'auto' or a positive number of milliseconds")
        return v


class SolverSpec(_Model):
    backend: str = "default"
    """highs, cbc, scip, cpsat, greedy, uniform, or 'default' (chosen from measurements)."""

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v):
        if v not in BACKEND_NAMES:
            near = difflib.get_close_matches(v, BACKEND_NAMES, n=1, cutoff=0.5)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"unknown backend {v!r}{hint}; known: {', '.join(BACKEND_NAMES)}")
        return v
    time_limit_s: float = Field(default=60.0, gt=0)
    rel_gap: float = Field(default=1e-4, ge=0, lt=1)
    threads: int = Field(default=1, ge=1)
    seed: int = 0
    refine_rounds: int = Field(default=8, ge=0)
    """Replayer-driven re-solves when the linear model misses a bound."""


class RuntimeSpec(_Model):
    kernels: Literal["auto", "templated", "torch"] = "auto"
    """'auto': per device, what kernels/dispatch.py picks (templated kernels where they exist and are
    the chosen path, else torch ops; a failed build falls back to torch); 'templated' insists;
    'torch' uses torch ops only. The planner prices what this setting runs."""
    weight_granularity: Literal["per_tensor", "per_channel"] = "per_tensor"
    """INT8/INT4 weight scales."""
    backward_precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Precision of the backward pass of quantized operators."""
    rounding: Literal["nearest", "stochastic"] = "nearest"
    boundary: Literal["edge", "fp32"] = "fp32"
    """Where casts are paid. 'fp32' (this package's runtime, CPU and CUDA): every quantized operator
    casts its input in and returns fp32. 'edge': activations flow at low precision and a cast happens
    only where adjacent operators differ (QSync's runtime); plans costed for it are for comparison,
    and `train` refuses them."""


class Calibration(_Model):
    batches: int = Field(default=4, ge=1)
    """Calibration batches: the first N batches of the job's training data."""
    batch_size: int | None = Field(default=None, ge=1)
    """Samples per calibration batch; default min(global_batch, 32)."""


class IndicatorSpec(_Model):
    """How operator sensitivity ω is measured (the plan names the method)."""

    method: Literal["weight", "gvar", "hessian", "empirical"] = "weight"
    """'weight': weight quantisation noise; 'gvar': QSync's bi-directional variance from
    calibration batches; 'hessian': Hutchinson trace x quantisation error (HAWQ); 'empirical':
    measured loss change when only that op is lowered."""
    calibration: Calibration = Field(default_factory=Calibration)



class JobSpec(_Model):
    """A whole job: cluster, model, workload, objective and solver settings."""

    kind: Literal["training", "serving"] = "training"
    name: str = "job"
    cluster: Cluster
    model: ModelSpec | None = None
    """The network to train (kind: training); serving specs describe theirs in serving.model."""
    training: TrainingSpec | None = None
    serving: ServingSpec | None = None
    objective: Objective = Field(default_factory=Objective)
    solver: SolverSpec = Field(default_factory=SolverSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    indicator: IndicatorSpec = Field(default_factory=IndicatorSpec)
    costs: Literal["auto", "measured", "roofline"] = "auto"
    """'auto': a group's measured profile when one matches its device and covers the model, else
    the roofline; 'measured': insist (devices that run here are profiled on first use);
    'roofline': datasheet model only."""
    allow_code_env: bool = False
    """Let group env set keys that load code (LD_PRELOAD, PYTHONPATH, ...): only for specs you wrote."""

    @model_validator(mode="after")
    def _no_code_env(self) -> "JobSpec":
        if self.allow_code_env:
            return self
        bad = [f"cluster.groups.{i}.env.{k}" for i, g in enumerate(self.cluster.groups) for k in g.env if loads_code(k)]
        if bad:
            raise ValueError(f"{', '.join(bad)}: this env key makes every rank load code chosen by the spec; "
                             "remove it, or set allow_code_env: true at the top of a spec you trust")
        return self

    @model_validator(mode="after")
    def _training_memory_usable(self) -> "JobSpec":
        """A training group's memory_gb must leave room beyond the training runtime's own overhead
        (serving specs carry their own overhead model in serving.runtime_overhead_gb)."""
        if self.kind != "training":
            return self
        from qsync_opt.predictor.memory import capacity_bytes  # lazy: only specs that override memory pay for it

        for i, g in enumerate(self.cluster.groups):
            if g.memory_gb is None:
                continue
            kind = g.device_spec.kind
            if capacity_bytes(g.memory_gb * 1e9, kind) <= 0:
                need = capacity_bytes(0.0, kind) / -0.95 / 1e9
                raise ValueError(
                    f"cluster.groups.{i}.memory_gb: {g.memory_gb:g} GB leaves no usable memory: the {kind} runtime "
                    f"itself takes about {need:.2g} GB (context, allocator); give more than {need:.2g} GB, "
                    "or omit memory_gb")
        return self
    data: DataSpec | None = None
    """Training and test data (default: the synthetic teacher task)."""

    @model_validator(mode="after")
    def _workload_matches_kind(self) -> "JobSpec":
        if self.kind == "training" and self.training is None:
            raise ValueError("kind: training needs a 'training' section (at least global_batch)")
        if self.kind == "serving" and self.serving is None:
            raise ValueError("kind: serving needs a 'serving' section (model, prompt_len, gen_tokens, global_batch)")
        if self.kind == "training" and self.model is None:
            raise ValueError("kind: training needs a 'model' section (name or import)")
        if self.objective.minimize == "iteration_time" and self.objective.max_accuracy_degradation is None:
            raise ValueError("objective.minimize: iteration_time needs objective.max_accuracy_degradation")
        if self.training is not None:
            explicit = [g for g in self.cluster.groups if g.local_batch is not None]
            if len(explicit) == len(self.cluster.groups):
                total = sum(g.local_batch * g.count for g in self.cluster.groups)
                if total != self.training.global_batch:
                    raise ValueError(
                        f"local batches sum to {total} over all devices but training.global_batch is "
                        f"{self.training.global_batch}; make them agree or leave local_batch unset"
                    )
            elif explicit:
                self._left_for_the_rest(explicit)
        return self

    def _left_for_the_rest(self, explicit: list[DeviceGroup]) -> int:
        """Samples of the global batch left for groups without local_batch; ValueError if too few."""
        taken = sum(g.local_batch * g.count for g in explicit)
        rest = [g for g in self.cluster.groups if g.local_batch is None]
        devices = sum(g.count for g in rest)
        left = self.training.global_batch - taken
        if left < devices:
            fixed = " + ".join(f"{g.name} {g.count} x {g.local_batch}" for g in explicit)
            raise ValueError(
                f"local_batch: the groups that set it take {taken} samples ({fixed}) of training.global_batch="
                f"{self.training.global_batch}, leaving {max(left, 0)} for the {devices} device(s) of "
                f"{', '.join(g.name for g in rest)}, which need at least 1 each; lower local_batch, raise "
                "global_batch, or set local_batch on every group")
        return left

    def local_batches(self) -> dict[str, int]:
        """Per-device batch per group: explicit ones kept, the rest of the global batch split evenly."""
        assert self.training is not None
        fixed = {g.name: g.local_batch for g in self.cluster.groups if g.local_batch is not None}
        rest = [g for g in self.cluster.groups if g.local_batch is None]
        left = self.training.global_batch - sum(fixed[g.name] * g.count for g in self.cluster.groups if g.name in fixed)
        devices = sum(g.count for g in rest)
        if rest and (left < devices):
            try:
                self._left_for_the_rest([g for g in self.cluster.groups if g.local_batch is not None])
            except ValueError as e:
                raise SpecError(str(e)) from None
        out = dict(fixed)
        for g in rest:
            out[g.name] = max(1, left // devices) if devices else 0
        return out

    def digest(self) -> str:
        """Stable hash of the spec's content, recorded in plans for provenance."""
        blob = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", by_alias=True, exclude_defaults=True), sort_keys=False)


# --------------------------------------------------------------------------------- loading
def load_spec(source: "str | Path | dict | JobSpec", **overrides: Any) -> JobSpec:
    """Parse and validate a spec from a path, a YAML string or a dict.

    `overrides` use dotted paths, e.g. `load_spec(p, **{"solver.backend": "cbc"})`.
    """
    if isinstance(source, JobSpec):
        data, text, origin = source.model_dump(mode="json", by_alias=True), None, "<JobSpec>"
    elif isinstance(source, dict):
        data, text, origin = source, None, "<dict>"
    else:
        text, origin = _read_text(source)
        try:
            data = yaml.load(text, Loader=UniqueKeyLoader) or {}
        except DuplicateKey as e:
            raise SpecError(f"{origin}: {e}") from None
        except yaml.YAMLError as e:
            raise SpecError(f"{origin}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise SpecError(f"{origin}: the spec must be a mapping (key: value), got {type(data).__name__}")
    data = _apply_overrides(data, overrides)
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_errors(e, text, origin, JobSpec)) from None


def _read_text(source: "str | Path") -> tuple[str, str]:
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and source.endswith((".yaml", ".yml", ".json"))):
        path = Path(source)
        if not path.exists():
            raise SpecError(f"spec file {str(path)!r} does not exist; check the path (try examples/cpu_tiny.yaml)")
        return path.read_text(), str(path)
    return str(source), "<string>"


def _apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    if not overrides:
        return data
    data = json.loads(json.dumps(data))  # deep copy of plain data
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return data
