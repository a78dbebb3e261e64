"""Models: the zoo (plain torch.nn, random weights) and torch.fx tracing to OpGraph.

The names below are imported when first used (`trace` is the function of `qsync_opt.models.tracing`), so that a
module that needs only a torch-free part (`models.spec`, `models.graph`) does not import torch with the package.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "SELECTABLE_KINDS": "graph", "OpGraph": "graph", "OpNode": "graph", "trace": "tracing",
    "ZOO": "zoo", "ModelEntry": "zoo", "build_model": "zoo", "get_entry": "zoo", "list_models": "zoo",
    "load_factory": "zoo",
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"qsync_opt.models.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'qsync_opt.models' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
