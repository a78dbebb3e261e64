"""The predictor: what each operator costs and how much precision it can lose, per device.

Roofline costs and casts (costs, casts), memory (memory), gradient all-reduce (comm), the
sensitivity indicators (indicator, gvar), the replayer that judges a plan on a timeline, and
the builder that turns a spec into the solver's TrainingInstance.

Its names are imported when first used (qsync_opt.lazy): importing one of its modules (the profile file, the
measuring helpers) does not import torch through this package.
"""

from qsync_opt import lazy

_WHERE = {
    "cast_ms": "qsync_opt.training.predictor.casts",
    "edge_cast_ms": "qsync_opt.training.predictor.casts",
    "resolve_backward_precision": "qsync_opt.training.predictor.casts",
    "allreduce_ms": "qsync_opt.training.predictor.comm",
    "ddp_buckets": "qsync_opt.training.predictor.comm",
    "Context": "qsync_opt.training.predictor.context",
    "GroupContext": "qsync_opt.training.predictor.context",
    "OpCost": "qsync_opt.training.predictor.costs",
    "op_costs": "qsync_opt.training.predictor.costs",
    "optimizer_ms": "qsync_opt.training.predictor.costs",
    "Sensitivity": "qsync_opt.training.predictor.indicator",
    "gvar_indicator": "qsync_opt.training.predictor.indicator",
    "weight_indicator": "qsync_opt.training.predictor.indicator",
    "baseline": "qsync_opt.training.predictor.instance_builder",
    "build_instance": "qsync_opt.training.predictor.instance_builder",
    "MemoryModel": "qsync_opt.training.predictor.memory",
    "memory_model": "qsync_opt.training.predictor.memory",
    "GroupTimeline": "qsync_opt.training.predictor.replayer",
    "Timeline": "qsync_opt.training.predictor.replayer",
    "replay": "qsync_opt.training.predictor.replayer",
    "verify": "qsync_opt.training.predictor.replayer",
}
__getattr__, __dir__ = lazy.names(__name__, _WHERE)
__all__ = list(_WHERE)
