"""The runtime: quantized operators, apply_plan/strip, and synchronous data-parallel training.

    apply_plan(model, plan, group)   swap selectable modules for quantized ones by FQN
    strip(model)                     restore plain modules with the same parameters
    launch.launch(spec, plan, ...)   `qsync-opt train`: one process per rank over torch.distributed
    run_job(spec, plan, ...)         the same, returning a JobResult (losses, step times)
"""

from __future__ import annotations

from qsync_opt.runtime.apply import Change, apply_plan, current_precisions, selectable_modules, strip
from qsync_opt.runtime.qmodules import SWAPPABLE, QConv1d, QConv2d, QEmbedding, QLinear, QMatMul, QuantizedModule
from qsync_opt.runtime.recipe import Recipe

__all__ = [
    "Change", "apply_plan", "current_precisions", "selectable_modules", "strip",
    "SWAPPABLE", "QConv1d", "QConv2d", "QEmbedding", "QLinear", "QMatMul", "QuantizedModule", "Recipe",
    "run_job", "JobResult",
]


def __getattr__(name):  # the launcher pulls in torch.distributed; load it only when asked for
    if name in ("run_job", "JobResult"):
        from qsync_opt.runtime import launch as _launch

        return getattr(_launch, name)
    raise AttributeError(name)
