"""The predictor: what each operator costs and how much precision it can lose, per device.

Roofline costs and casts (costs, casts), memory (memory), gradient all-reduce (comm), the
sensitivity indicators (indicator, gvar), the replayer that judges a plan on a timeline, and
the builder that turns a spec into the solver's TrainingInstance.
"""

from .casts import cast_ms, edge_cast_ms, resolve_backward_precision
from .comm import allreduce_ms, ddp_buckets
from .context import Context, GroupContext
from .costs import OpCost, op_costs, optimizer_ms
from .indicator import Sensitivity, gvar_indicator, weight_indicator
from .instance_builder import baseline, build_instance
from .memory import MemoryModel, memory_model
from .replayer import GroupTimeline, Timeline, replay, verify

__all__ = [
    "Context", "GroupContext", "GroupTimeline", "MemoryModel", "OpCost", "Sensitivity", "Timeline",
    "allreduce_ms", "baseline", "build_instance", "cast_ms", "ddp_buckets", "edge_cast_ms",
    "gvar_indicator", "memory_model", "op_costs", "optimizer_ms", "replay",
    "resolve_backward_precision", "verify", "weight_indicator",
]
