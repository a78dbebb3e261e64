"""The `model:` section of a training spec: a zoo name, or a factory in the user's own code."""

from __future__ import annotations

from typing import Any, Literal

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
