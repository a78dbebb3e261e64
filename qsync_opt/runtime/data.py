"""Training data for the runtime; the datasets themselves live in `qsync_opt.data`."""

from __future__ import annotations

from qsync_opt.data.synthetic import CHUNK, SyntheticTask, build_model, input_maker, shard
from qsync_opt.data.task import build_task

__all__ = ["CHUNK", "SyntheticTask", "build_model", "build_task", "input_maker", "shard"]
