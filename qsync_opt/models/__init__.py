"""Models: the zoo (plain torch.nn, random weights) and torch.fx tracing to OpGraph.

`trace` here is the function (imported eagerly, so the name never resolves to the submodule
`qsync_opt.models.trace`); this imports torch with the package.
"""

from __future__ import annotations

from qsync_opt.models.graph import SELECTABLE_KINDS, OpGraph, OpNode
from qsync_opt.models.trace import trace
from qsync_opt.models.zoo import ZOO, ModelEntry, build_model, get_entry, list_models, load_factory

__all__ = [
    "SELECTABLE_KINDS", "OpGraph", "OpNode", "ZOO", "ModelEntry",
    "build_model", "get_entry", "list_models", "load_factory", "trace",
]
