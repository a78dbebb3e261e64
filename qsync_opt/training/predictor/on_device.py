"""Where the training profiler measures a group, and the clock it reads there.

A CPU group is measured on CPU tensors with `time.perf_counter`. A GPU group is measured on this
machine's GPU, the one its rank trains on (LOCAL_RANK, else 0), as the trainer places it: the model
quantized on the CPU and then moved, each batch moved per step. Its clock reads CUDA events
(`EventClock`): every reading records an event on the current stream, waits for it and returns the
seconds since a base event, so the interval between two readings is the GPU's own time from the end of
the work before the first reading to the end of the work before the second, the gaps in which the
GPU waits for the host's launches included and the host's wait for the event left out. The estimator
(estimator.robust_ms) and the whole steps (step_profile.adaptive_step_times_ms) take it as their `clock`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from qsync_opt.training.predictor.profile import ProfileError


def profile_device(group) -> torch.device:
    """The torch device `group`'s ranks train on here; ProfileError naming the group when a GPU group
    finds no CUDA device (the profiler must never time the CPU under a GPU's name)."""
    if group.device_spec.kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ProfileError(f"profiler: group {group.name} runs on {group.device_spec.name}, but torch "
                           f"{torch.__version__} sees no CUDA device here; profile it on a machine with that GPU")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    return device


class EventClock:
    """Seconds on the GPU's timeline (see the module docstring): each call records a CUDA event, waits for
    it, and returns its time since the base event recorded when the clock was made."""

    def __init__(self, device: torch.device):
        self.device = device
        with torch.cuda.device(device):
            self.base = torch.cuda.Event(enable_timing=True)
            self.base.record()

    def __call__(self) -> float:
        with torch.cuda.device(self.device):
            e = torch.cuda.Event(enable_timing=True)
            e.record()
        e.synchronize()
        return self.base.elapsed_time(e) / 1e3


def device_clock(device: torch.device) -> Callable[[], float]:
    """The clock of `device`'s time in seconds: perf_counter on the CPU, CUDA events on a GPU."""
    return EventClock(device) if device.type == "cuda" else time.perf_counter


def to_device(tensors, device: torch.device) -> tuple:
    """A tuple of `tensors` on `device` (the trainer moves each batch so: `t.to(device)`)."""
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors)
