"""Context: everything the predictor derived for a job, kept for verifying and reporting plans.

`build_instance` flattens it into a TrainingInstance (plain numbers for the solver); the
replayer reads it back to judge an assignment on a timeline, and the plan writer reads its
per-group breakdown. Plain frozen data, no module references.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from qsync_opt.hardware.device import DeviceSpec
from qsync_opt.models.graph import OpGraph
from qsync_opt.training.predictor.comm import Bucket
from qsync_opt.training.predictor.costs import OpCost
from qsync_opt.training.predictor.memory import MemoryModel


def cost_kind(source: str) -> Literal["measured", "calibrated", "datasheet"]:
    """'measured', 'calibrated' (roofline with factors measured on this architecture) or
    'datasheet' (roofline from the catalog alone) for a GroupContext.cost_source."""
    if source.startswith("measured"):
        return "measured"
    return "calibrated" if source.startswith("roofline, calibrated") else "datasheet"


@dataclass(frozen=True)
class GroupContext:
    """One device group's derived costs, at its local batch."""

    name: str
    device: DeviceSpec
    count: int
    local_batch: int
    role: Literal["training", "inference"]
    graph: OpGraph
    """The traced graph rescaled to `local_batch`."""
    backward_precision: str
    """The runtime's backward precision as resolved for this device."""
    allowed: dict[str, tuple[str, ...]]
    """op -> precisions the plan may use, highest first."""
    costs: dict[str, dict[str, OpCost]]
    """Selectable op -> precision -> cost (every precision the device offers)."""
    other_costs: dict[str, dict[str, OpCost]]
    """Non-selectable op -> format it runs in (followers.py) -> cost."""
    owner: dict[str, str | None]
    """Non-selectable op -> the selectable op whose format it follows (None: fp32)."""
    optimizer_ms: float
    memory: MemoryModel
    buckets: tuple[Bucket, ...]
    mem_capacity_bytes: float
    time_bound_ms: float | None = None
    boundary: Literal["edge", "fp32"] = "edge"
    """Where casts happen: on edges (QSync) or around every op (this runtime); followers.py."""
    kernels: dict[str, dict[str, str]] = field(default_factory=dict)
    """Selectable op -> precision -> the kernels setting its measured profile found faster there
    (measured_dispatch.py); empty where nothing was raced (roofline costs, float formats)."""
    cost_source: str = "roofline"
    """'measured (<profile file>)' when the costs come from a profile; else 'roofline, calibrated: ...'
    (naming the calibration's ops, precisions and results files) or 'roofline, datasheet only',
    each with why it is not measured in parentheses. `cost_kind` reads it."""

    @property
    def cost_kind(self) -> Literal["measured", "calibrated", "datasheet"]:
        return cost_kind(self.cost_source)

    @property
    def highest(self) -> dict[str, str]:
        return {op: ps[0] for op, ps in self.allowed.items()}

    @property
    def lowest(self) -> dict[str, str]:
        return {op: ps[-1] for op, ps in self.allowed.items()}


@dataclass(frozen=True)
class Context:
    """The whole job as the predictor sees it."""

    groups: tuple[GroupContext, ...]
    world_size: int
    link_bandwidth_gbs: float
    link_latency_us: float
    global_batch: int
    time_bound_ms: float | None = None
    """The synchronisation bound given to inference groups (None if unbounded)."""
    training_groups: tuple[str, ...] = ()
    cost_source: str = "roofline"
    """'roofline', 'measured', or 'mixed' (per group in GroupContext.cost_source)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def group(self, name: str) -> GroupContext:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no group {name!r}; groups: {', '.join(g.name for g in self.groups)}")
