"""Calibration data for the indicators: the first batches of the job's own training data."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from qsync_opt.runtime.data import build_task

if TYPE_CHECKING:
    from qsync_opt.training.spec import JobSpec


def calibration_batches(spec: JobSpec, task=None) -> list[tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
    """The first N batches of the job's training data (its `data:` section, else the synthetic
    task), as (inputs, targets): sensitivity is a property of the data the job trains on."""

    cal = spec.indicator.calibration
    size = cal.batch_size or min(spec.training.global_batch, 32)
    task = task or build_task(spec)
    return [task.samples(i * size, size) for i in range(cal.batches)]
