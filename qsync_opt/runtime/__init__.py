"""The runtime: quantized operators, apply_plan/strip, checkpoints and rank processes.

    apply_plan(model, plan, group)   swap selectable modules for quantized ones by FQN
    strip(model)                     restore plain modules with the same parameters

Shared by every kind; the training loop and its launcher (`qsync-opt train`) are in
qsync_opt.training.runtime. The names below are imported when first used, so that a kind that needs only a
torch-free part (runtime.spawn, process_exit) does not import torch with the package.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "Change": "apply", "apply_plan": "apply", "current_precisions": "apply", "selectable_modules": "apply",
    "strip": "apply", "SWAPPABLE": "qmodules", "QConv1d": "qmodules", "QConv2d": "qmodules",
    "QEmbedding": "qmodules", "QLinear": "qmodules", "QMatMul": "qmodules", "QuantizedModule": "qmodules",
    "Recipe": "recipe",
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"qsync_opt.runtime.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'qsync_opt.runtime' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
