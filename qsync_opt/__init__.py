"""qsync-opt: plans for clusters of unlike accelerators, one declarative spec per problem kind.

    import qsync_opt
    plan = qsync_opt.solve("examples/hybrid_v100_t4_resnet50.yaml")
    plan.to_fqn_config("t4")    # {'conv1': 'fp16', 'layer1.0.conv1': 'int8', ...}

`solve` takes a spec of any registered kind (`qsync_opt.jobs.KINDS`: training, serving, rollout, loading) as a
path, YAML text, dict or job model, and returns that kind's plan (`Plan`, `ServingPlan`, `RolloutPlan`, ...).

The names below are looked up when first used, and a spec imports only its own kind: planning a serving, rollout
or loading job does not import torch (a cluster scheduler need not carry it); training does.
"""

from qsync_opt import lazy
from qsync_opt.errors import InfeasibleError, QSyncError, SpecError

__version__ = "0.1.0"

_LAZY = {
    "solve": "qsync_opt.jobs", "run": "qsync_opt.jobs", "load_spec": "qsync_opt.jobs", "load_plan": "qsync_opt.jobs",
    "KINDS": "qsync_opt.jobs", "JobSpec": "qsync_opt.training.spec", "Plan": "qsync_opt.training.plan",
    "ServingJob": "qsync_opt.serving.spec", "ServingPlan": "qsync_opt.serving.plan",
    "RolloutPlan": "qsync_opt.rollout.plan",
}
__all__ = ["solve", "run", "load_spec", "load_plan", "KINDS", "JobSpec", "ServingJob", "Plan", "ServingPlan",
           "RolloutPlan", "QSyncError", "SpecError", "InfeasibleError", "__version__"]

__getattr__, __dir__ = lazy.names(__name__, _LAZY)
