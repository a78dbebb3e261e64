"""Models: the zoo (plain torch.nn, random weights) and torch.fx tracing to OpGraph.

The names below are imported when first used (`trace` is the function of `qsync_opt.models.tracing`), so that a
module that needs only a torch-free part (`models.spec`, `models.graph`) does not import torch with the package.
"""

from __future__ import annotations

from qsync_opt import lazy

_LAZY = {name: f"qsync_opt.models.{module}" for module, names in {
    "graph": ("SELECTABLE_KINDS", "OpGraph", "OpNode"),
    "tracing": ("trace",),
    "zoo": ("ZOO", "ModelEntry", "build_model", "get_entry", "list_models", "load_factory"),
}.items() for name in names}
__all__ = list(_LAZY)

__getattr__, __dir__ = lazy.names(__name__, _LAZY)
