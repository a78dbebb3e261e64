"""One line per zoo model for `qsync-opt models`: task, input shape, operator count (CLI layer:
it reads the runtime's swappable types, which models/ may not import).

The input is what `example_inputs` feeds (batch dimension written B), drawn on the meta device;
the operator count is the model's precision-selectable modules (runtime/apply.py's swappable
types: Linear, Conv, Embedding), counted on a meta-device build, so no weights are allocated."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from qsync_opt.models.zoo import get_entry
from qsync_opt.runtime.apply import selectable_modules

_DTYPE = {torch.float32: "float32", torch.int64: "int64 token ids"}


@dataclass(frozen=True)
class ZooSummary:
    task: str
    input: str
    operators: int
    description: str


@cache
def summary(name: str) -> ZooSummary:
    entry = get_entry(name)
    inputs = entry.example_inputs(2, device="meta")
    shapes = ", ".join("(B, " + ", ".join(map(str, x.shape[1:])) + ") " + _DTYPE.get(x.dtype, str(x.dtype))
                       for x in inputs)
    if entry.input_kind == "tokens":
        shapes += f", vocab {entry.defaults['vocab_size']}"
    with torch.device("meta"):
        model = entry.build()
    return ZooSummary(entry.task, shapes, len(selectable_modules(model)), entry.description)
