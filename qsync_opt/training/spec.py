"""The job spec: what a user or a scheduler declares, validated before any work starts.

`load_spec` accepts a path, a YAML string or a dict. Every error names the field path, the
bad value, the YAML line where it stands and what would be accepted; unknown keys are
errors, so a typo never passes silently.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import Field, field_validator, model_validator

from qsync_opt.data.config import DataSpec
from qsync_opt.errors import SpecError
from qsync_opt.spec.base import SpecModel as _Model
from qsync_opt.hardware.cluster import INTERCONNECTS, Cluster, DeviceGroup, Interconnect  # noqa: F401 (re-exported)
from qsync_opt.models.spec import ModelSpec
from qsync_opt.solver.spec import BACKEND_NAMES, SolverSpec  # noqa: F401 (re-exported)
from qsync_opt.spec.load import read_document, validate
from qsync_opt.spec.yaml_loader import CODE_ENV, INT_ENV, loads_code  # noqa: F401 (re-exported)

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
    """Bound in ms on the lockstep iteration (the replayer's); 'auto' = the training groups' own
    iteration at their own precision (QSync), on the lockstep clock: their last all-reduce, then
    every group's optimizer step."""
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


class RuntimeSpec(_Model):
    kernels: Literal["auto", "templated", "torch"] = "auto"
    """'auto': per device, what kernels/dispatch.py picks (templated kernels where they exist and are
    the chosen path, else torch ops; a failed build falls back to torch); 'templated' insists;
    'torch' uses torch ops only. The planner prices what this setting runs."""
    weight_granularity: Literal["per_tensor", "per_channel"] = "per_tensor"
    """INT8/INT4 weight scales."""
    backward_precision: Literal["bf16", "fp16", "fp32", "fp8"] = "bf16"
    """Precision of the backward pass of quantized (int and fp8) operators. 'fp8': fp8 linears run both backward
    GEMMs in fp8 (the output gradient quantized to e5m2 per tensor, times their saved fp8 codes: torchao's float8
    training recipe), which pays only on fp8 tensor cores; every other quantized operator runs its backward in
    bf16 (fp16 where the device has no bf16)."""
    rounding: Literal["nearest", "stochastic"] = "nearest"
    boundary: Literal["edge", "fp32"] = "fp32"
    """Where casts are paid. 'fp32' (this package's runtime, CPU and CUDA): every quantized operator
    casts its input in and returns fp32. 'edge': activations flow at low precision and a cast happens
    only where adjacent operators differ (QSync's runtime); plans costed for it are for comparison,
    and `train` refuses them."""
    emulate: bool = False
    """Train groups whose device is not on this machine (a GPU spec on a CPU) by emulation on what
    is here, even where that is expected to run more than 10x slower than the device (the same as
    `train --emulate`). Without it, such a run is refused before any rank starts; emulation is
    announced either way."""


class Calibration(_Model):
    batches: int = Field(default=4, ge=1)
    """Calibration batches: the first N batches of the job's training data."""
    batch_size: int | None = Field(default=None, ge=1)
    """Samples per calibration batch; default min(global_batch, 32)."""


class IndicatorSpec(_Model):
    """How operator sensitivity ω is measured (the plan names the method)."""

    method: Literal["auto", "weight", "gvar", "hessian", "empirical"] = "auto"
    """'auto' (default): with a `data:` section, 'empirical' on weights trained in fp32 for
    `warmup_steps` steps (the indicator that ranked operators best in the committed accuracy runs,
    docs/indicators.md), computed once by `qsync-opt indicate` or `run` and cached; without data,
    'weight' (on random initial weights unless model.checkpoint is given). 'weight': weight
    quantisation noise; 'gvar': QSync's bi-directional variance from calibration batches;
    'hessian': Hutchinson trace x quantisation error (HAWQ); 'empirical': measured loss change
    when only that op is lowered."""
    warmup_steps: int = Field(default=400, ge=0)
    """method: auto with data: fp32 training steps on the job's data before ω is measured (the
    accuracy runs used 400); 0 measures on the initial weights. Not used with model.checkpoint,
    whose weights are already trained."""
    calibration: Calibration = Field(default_factory=Calibration)



class JobSpec(_Model):
    """A whole job: cluster, model, workload, objective and solver settings."""

    kind: Literal["training"] = "training"
    name: str = "job"
    cluster: Cluster
    model: ModelSpec | None = None
    """The network to train."""
    training: TrainingSpec | None = None
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
        """A training group's memory_gb must leave room beyond the training runtime's own overhead."""
        from qsync_opt.runtime.memory import capacity_bytes  # import cost: qsync_opt.runtime (quantized modules); every command reads a spec

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
        if self.training is None:
            raise ValueError("kind: training needs a 'training' section (at least global_batch)")
        if self.model is None:
            raise ValueError("kind: training needs a 'model' section (name or import)")
        if self.objective.minimize == "iteration_time" and self.objective.max_accuracy_degradation is None:
            raise ValueError("objective.minimize: iteration_time needs objective.max_accuracy_degradation")
        if self.training is not None:
            explicit = [g for g in self.cluster.groups if g.local_batch is not None]
            if len(explicit) == len(self.cluster.groups):
                total = sum(g.local_batch * g.count for g in self.cluster.groups)
                if total != self.training.global_batch:
                    terms = " + ".join(f"{g.name} {g.count} x {g.local_batch}" for g in self.cluster.groups)
                    raise ValueError(
                        f"local batches (count x local_batch per group: {terms}) sum to {total} over all devices but "
                        f"training.global_batch is {self.training.global_batch}; make them agree or leave local_batch unset"
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


def load_spec(source: "str | Path | dict | JobSpec", **overrides: Any) -> JobSpec:
    """A training job from a path, a YAML string, a dict or a JobSpec; SpecError naming the field.

    `overrides` use dotted paths, e.g. `load_spec(p, **{"solver.backend": "cbc"})`. Specs of
    other kinds are refused with the command that plans them (`qsync_opt.load_spec` reads any kind).
    """
    if isinstance(source, JobSpec) and not overrides:
        return source
    data, text, origin = read_document(source)
    kind = data.get("kind", "training")
    if kind != "training":
        raise SpecError(f"{origin}: kind: {kind}: this command profiles, plans and trains a training job; "
                        f"plan a {kind} spec with `qsync-opt solve` or qsync_opt.solve()")
    return validate(JobSpec, data, text, origin, overrides)
