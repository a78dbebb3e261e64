"""The `model:` section of a training spec, and what the shared layers read of a job around it."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from pydantic import Field, model_validator

from qsync_opt.spec.base import SpecModel as _Model


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
    output: str | int | None = None
    """Which part of the forward's output is the logits, for models returning a ModelOutput, a dict or
    a tuple (Hugging Face models: 'logits'); an int picks a tuple element. Default: the output itself."""

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        if (self.name is None) == (self.import_ is None):
            raise ValueError("give exactly one of model.name (a zoo model) or model.import ('pkg.module:factory')")
        if self.import_ is not None and self.input_shape is None:
            raise ValueError("an imported model needs model.input_shape (per-sample, e.g. [3, 32, 32])")
        if self.import_ is not None and ":" not in self.import_:
            raise ValueError(f"model.import must look like 'pkg.module:factory', got {self.import_!r}")
        return self


class TrainingSettings(Protocol):
    """What the shared layers read of a job's training section: its seed and its sequence length."""

    @property
    def seed(self) -> int: ...

    @property
    def seq_len(self) -> int | None: ...


class ModelJob(Protocol):
    """What `models.from_spec` and the synthetic data read of a job: its model section, and its training
    section (seed; `seq_len` sizes a sequence model's inputs) or None. A training `JobSpec` is one."""

    @property
    def model(self) -> ModelSpec: ...

    @property
    def training(self) -> TrainingSettings | None: ...
