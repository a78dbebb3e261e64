"""The predictor: what each operator costs and how much precision it can lose, per device.

Roofline costs and casts (costs, casts), memory (memory), gradient all-reduce (comm), the
sensitivity indicators (indicator, gvar), the replayer that judges a plan on a timeline, and
the builder that turns a spec into the solver's TrainingInstance.
"""

from qsync_opt.predictor.casts import cast_ms, edge_cast_ms, resolve_backward_precision
from qsync_opt.predictor.comm import allreduce_ms, ddp_buckets
from qsync_opt.predictor.context import Context, GroupContext
from qsync_opt.predictor.costs import OpCost, op_costs, optimizer_ms
from qsync_opt.predictor.indicator import Sensitivity, gvar_indicator, weight_indicator
from qsync_opt.predictor.instance_builder import baseline, build_instance
from qsync_opt.predictor.memory import MemoryModel, memory_model
from qsync_opt.predictor.replayer import GroupTimeline, Timeline, replay, verify

__all__ = [
    "Context", "GroupContext", "GroupTimeline", "MemoryModel", "OpCost", "Sensitivity", "Timeline",
    "allreduce_ms", "baseline", "build_instance", "cast_ms", "ddp_buckets", "edge_cast_ms",
    "gvar_indicator", "memory_model", "op_costs", "optimizer_ms", "replay",
    "resolve_backward_precision", "verify", "weight_indicator",
]
