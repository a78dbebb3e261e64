"""Datasets: bundled real sets, user factories, the synthetic teacher task; per-rank slicing.

Every task reads sample i of the training stream by its global index, so any split of a
global batch over ranks sees the same samples and a resumed run continues exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qsync_opt.data.config import BUILTIN, DataSpec

if TYPE_CHECKING:  # the runtime parts import torch; keep `import qsync_opt.training.spec` light
    from qsync_opt.data.check import check_data
    from qsync_opt.data.evaluation import EvalLog, evaluate
    from qsync_opt.data.task import DatasetTask, build_task

__all__ = ["BUILTIN", "DataSpec", "DatasetTask", "EvalLog", "build_task", "check_data", "evaluate"]


def __getattr__(name: str):
    if name not in ("DatasetTask", "build_task", "EvalLog", "evaluate", "check_data"):
        raise AttributeError(name)
    from qsync_opt.data import check, evaluation, task  # import cost: torch (kept off `import qsync_opt.data`)

    return getattr({"check_data": check, "EvalLog": evaluation, "evaluate": evaluation}.get(name, task), name)
