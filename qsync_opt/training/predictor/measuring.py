"""Measuring helpers every profiler module shares: the timing estimator's settings, the cast
sizes, a rank's thread count and a clamped least-squares line and a progress bar.

Imports no torch (the `qsync-opt profile` parent starts its measuring processes without it);
`is_local` imports it only to ask about a GPU device."""

from __future__ import annotations

import hashlib
import json
import os
import statistics

from qsync_opt.hardware.machine import cuda_possible
from qsync_opt.training.predictor import estimator as est

CAST_PAIRS = (("fp32", "bf16"), ("bf16", "fp32"), ("fp32", "fp16"), ("fp16", "fp32"), ("fp32", "int8"), ("int8", "fp32"))
CAST_SIZES = (1 << 12, 1 << 15, 1 << 18, 1 << 20)

BLOCKS, REPEATS = est.BLOCKS, est.REPEATS
"""The estimator's blocks and repeats for op timings (tests patch them)."""


def robust_ms(fn, **kw) -> float:
    """estimator.robust_ms with this module's BLOCKS/REPEATS (tests patch them)."""
    kw.setdefault("blocks", BLOCKS)
    kw.setdefault("repeats", REPEATS)
    return est.robust_ms(fn, **kw)


def group_threads(group, world_size: int) -> int:
    """Threads a rank of `group` trains with: its env's OMP_NUM_THREADS, else the launcher's split
    of the CPU (GPU ranks: 1, their host threads do not decide the kernels)."""
    v = group.env.get("OMP_NUM_THREADS")
    if v:
        return int(v)
    return max(1, (os.cpu_count() or 1) // world_size) if group.device_spec.kind == "cpu" else 1


def lockstep_median_ms(per_rank: list[list[float]]) -> float:
    """Median over steps of the slowest rank's time: how `train` reads a DDP iteration
    (run_stages.measured_iteration_ms), rather than the slowest rank's median."""
    return statistics.median(max(ts) for ts in zip(*per_rank, strict=True))


def fit_line(xs, ys) -> tuple[float, float]:
    """Least-squares a, b of y = a·x + b, both clamped at 0."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    a = max(a, 0.0)
    return a, max(my - a * mx, 0.0)


class ProgressBar:
    """A rich progress bar on stderr (silent when off): the profiler's ops and whole steps, the auto
    indicator's warm-up. Shows the time elapsed and rich's estimate of the time left (the units
    done per second so far, over the units left), so a caller whose units differ in cost scales
    them to one another (`advance(amount)`, `set_total`)."""

    def __init__(self, on: bool, label: str, total: float):
        self.p = None
        if on and total:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.p = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                              TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                              console=Console(stderr=True), transient=False)
            self.p.start()
            self.task = self.p.add_task(label, total=total)

    def advance(self, amount: float = 1.0):
        if self.p:
            self.p.advance(self.task, amount)

    def set_total(self, total: float):
        """The work's new size, once what is left is better known."""
        if self.p:
            self.p.update(self.task, total=total)

    def close(self):
        if self.p:
            self.p.stop()


def local_ranks(spec) -> int:
    """Ranks of `spec` that train on this machine at once (its section is measured beside them)."""
    return sum(g.count for g in spec.cluster.groups if is_local(g.device_spec))


#: Why a GPU group is not profiled beside other ranks of its spec on this machine.
GPU_COLOCATED = ("the co-located profiler (several ranks of the spec on this machine at once, colocate.py) runs CPU "
                 "ranks only: a GPU rank beside others would need its own device and NCCL, which it does not set up")


def gpu_not_profiled(spec, group) -> str | None:
    """Why `group`, whose device runs here, cannot be profiled here, or None. A GPU group is profiled on its
    GPU (on_device.py) when it is the only rank of the spec on this machine; beside other local ranks it
    is not (GPU_COLOCATED)."""
    if group.device_spec.kind == "cpu" or local_ranks(spec) <= 1:
        return None
    return f"{group.device_spec.name} is here beside {local_ranks(spec) - 1} other local rank(s), and {GPU_COLOCATED}"


def is_local(device) -> bool:
    """Whether `device` is this machine's own kind of device, so its profile can be measured here."""
    if device.kind == "cpu":
        return True
    if not cuda_possible():
        return False
    import torch  # import cost: torch, only to ask which GPU this is

    if not torch.cuda.is_available():
        return False
    here = torch.cuda.get_device_name(0).lower().replace(" ", "")
    return device.name.lower().split("-")[0] in here


def ddp_key(spec) -> str:
    """Profile key of one DDP step: world, model, optimizer and every rank's env, threads, batch."""
    world = spec.cluster.world_size
    ranks = [(g.env, group_threads(g, world), spec.local_batches()[g.name])
             for g in spec.cluster.groups for _ in range(g.count)]
    data = spec.data.model_dump(mode="json") if getattr(spec, "data", None) is not None else "synthetic"
    ident = json.dumps([spec.model.model_dump(mode="json"), spec.training.optimizer, ranks, data], sort_keys=True)
    return f"ddp/{world}|{hashlib.sha256(ident.encode()).hexdigest()[:12]}"
