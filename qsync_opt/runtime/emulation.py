"""Which of a spec's device groups this machine can only emulate, on what, and how much slower.

A rank runs on CUDA when this machine has it, else on the CPU (runtime/trainer.py). A group
whose device is a GPU therefore runs on this CPU when there is no CUDA: every GEMM goes to the
CPU implementation kernels/dispatch.py names for its precision, priced at the rate of the
catalog's `cpu-local` entry. The expected slowdown of a group is, over the precisions its plan
uses, the worst ratio of the device's achieved rate to the host's for the implementation that
runs there; a precision the host has no rate for (fp16 on a CPU without AMX-FP16: oneDNN runs
it far below fp32, docs/devices.md) has no bound. `train` and `run` announce every emulated group before
any rank starts, and refuse a slowdown above EMULATION_LIMIT unless asked (`--emulate` or
`runtime.emulate: true`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Protocol

from qsync_opt.errors import RuntimeSetupError
from qsync_opt.hardware.cluster import Cluster
from qsync_opt.hardware.device import DeviceSpec, catalog
from qsync_opt.kernels.dispatch import implementation
from qsync_opt.runtime.apply import PrecisionPlan

EMULATION_LIMIT = 10.0
"""Refuse (unless asked) an emulation expected to run more than this many times slower."""
HOST_DEVICE = "cpu-local"
"""The catalog entry that prices this CPU when it stands in for a GPU."""


class EmulateSetting(Protocol):
    """A job's runtime section, as emulation reads it: whether the spec asks for emulation."""

    @property
    def emulate(self) -> bool: ...


class ClusterJob(Protocol):
    """What emulation reads of a job: its cluster, and its runtime section's `emulate`."""

    @property
    def cluster(self) -> Cluster: ...

    @property
    def runtime(self) -> EmulateSetting: ...


@dataclass(frozen=True)
class Emulation:
    """One group run on something other than its device."""

    group: str
    device: str
    host: str
    slowdown: float
    """Expected host time / device time (math.inf: a precision with no rate on the host)."""
    worst: str
    """The precision that sets the slowdown, and how it runs on the host."""

    def to_json(self) -> dict:
        return {"group": self.group, "device": self.device, "host": self.host,
                "expected_slowdown": None if math.isinf(self.slowdown) else round(self.slowdown, 1),
                "worst": self.worst}

    def describe(self) -> str:
        x = "no bound on the slowdown" if math.isinf(self.slowdown) else f"expected ~{self.slowdown:.0f}x slower"
        return f"group {self.group!r} ({self.device}) emulated on {self.host}: {x} than on {self.device} ({self.worst})"


def cuda_here() -> bool:
    import torch

    return torch.cuda.is_available() and os.environ.get("QSYNC_DEVICE", "auto") != "cpu"


def _achieved(device: DeviceSpec, precision: str) -> tuple[float, str]:
    impl = implementation(device, precision, device.kernels)
    if impl.rate not in device.peak_tflops:
        return 0.0, impl.label
    return device.achieved_flops(precision, "linear") / 1e12, impl.label  # calibrated where measured


def emulated_groups(spec: ClusterJob, plan: PrecisionPlan | None = None, *,
                    cuda: bool | None = None) -> list[Emulation]:
    """The spec's groups whose device is a GPU while this machine has no CUDA, with their expected slowdown."""
    cuda = cuda_here() if cuda is None else cuda
    if cuda:
        return []
    host = catalog()[HOST_DEVICE]
    out = []
    for g in spec.cluster.groups:
        dev = g.device_spec
        if dev.kind == "cpu":
            continue
        used = {"fp32"}
        if plan is not None and g.name in plan.groups:
            used |= set(plan.groups[g.name].precisions.values())
        worst, worst_p, how = 0.0, "fp32", ""
        for p in sorted(used):
            dev_rate, _ = _achieved(dev, p)
            host_rate, label = _achieved(host, p)
            ratio = math.inf if host_rate <= 0 else dev_rate / host_rate
            if ratio > worst:
                worst, worst_p, how = ratio, p, label
        out.append(Emulation(g.name, dev.name, f"this CPU (priced as {HOST_DEVICE})", worst,
                             f"{worst_p} runs as {how}"))
    return out


def check_emulation(spec: ClusterJob, plan: PrecisionPlan | None = None, *, emulate: bool = False, log=print,
                    cuda: bool | None = None) -> list[Emulation]:
    """Announce the emulated groups; refuse one slower than EMULATION_LIMIT unless `emulate`
    (or the spec's runtime.emulate). Returns the emulated groups."""
    found = emulated_groups(spec, plan, cuda=cuda)
    if not found:
        return found
    asked = emulate or spec.runtime.emulate
    log("emulation: this machine has no CUDA device, so these groups run on its CPU, not on their devices:")
    for e in found:
        log(f"  - {e.describe()}")
    slow = [e for e in found if e.slowdown > EMULATION_LIMIT]
    if slow and not asked:
        raise RuntimeSetupError(
            f"{len(slow)} group(s) would be emulated more than {EMULATION_LIMIT:g}x slower than their device "
            f"({', '.join(e.group for e in slow)}); run on a machine with those devices, or ask for emulation "
            "with --emulate (or runtime.emulate: true in the spec)")
    log("emulation: measured times are this CPU's, not the devices' (predictions are for the devices)")
    return found
