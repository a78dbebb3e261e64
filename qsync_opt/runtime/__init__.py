"""The runtime: quantized operators, apply_plan/strip, checkpoints and rank processes.

    apply_plan(model, plan, group)   swap selectable modules for quantized ones by FQN
    strip(model)                     restore plain modules with the same parameters

Shared by every kind; the training loop and its launcher (`qsync-opt train`) are in
qsync_opt.training.runtime.
"""

from __future__ import annotations

from qsync_opt.runtime.apply import Change, apply_plan, current_precisions, selectable_modules, strip
from qsync_opt.runtime.qmodules import SWAPPABLE, QConv1d, QConv2d, QEmbedding, QLinear, QMatMul, QuantizedModule
from qsync_opt.runtime.recipe import Recipe

__all__ = [
    "Change", "apply_plan", "current_precisions", "selectable_modules", "strip",
    "SWAPPABLE", "QConv1d", "QConv2d", "QEmbedding", "QLinear", "QMatMul", "QuantizedModule", "Recipe",
]
