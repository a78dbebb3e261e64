"""The runtime: quantized operators, apply_plan/strip, checkpoints and rank processes.

    apply_plan(model, plan, group)   swap selectable modules for quantized ones by FQN
    strip(model)                     restore plain modules with the same parameters

Shared by every kind; the training loop and its launcher (`qsync-opt train`) are in
qsync_opt.training.runtime. The names below are imported when first used, so that a kind that needs only a
torch-free part (runtime.spawn, process_exit) does not import torch with the package.
"""

from __future__ import annotations

from qsync_opt import lazy

_LAZY = {name: f"qsync_opt.runtime.{module}" for module, names in {
    "apply": ("Change", "apply_plan", "current_precisions", "selectable_modules", "strip"),
    "qmodules": ("SWAPPABLE", "QConv1d", "QConv2d", "QEmbedding", "QLinear", "QMatMul", "QuantizedModule"),
    "recipe": ("Recipe",),
}.items() for name in names}
__all__ = list(_LAZY)

__getattr__, __dir__ = lazy.names(__name__, _LAZY)
