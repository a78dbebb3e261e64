"""qsync-opt: plans for clusters of unlike accelerators, one declarative spec per problem kind.

    import qsync_opt
    plan = qsync_opt.solve("examples/hybrid_v100_t4_resnet50.yaml")
    plan.to_fqn_config("t4")    # {'conv1': 'fp16', 'layer1.0.conv1': 'int8', ...}

`solve` takes a spec of any registered kind (`qsync_opt.jobs.KINDS`: training, serving, rollout) as a path,
YAML text, dict or job model, and returns that kind's plan (`Plan`, `ServingPlan`, `RolloutPlan`).
"""

from qsync_opt.errors import InfeasibleError, QSyncError, SpecError
from qsync_opt.jobs import KINDS, load_plan, load_spec, run, solve
from qsync_opt.rollout.plan import RolloutPlan
from qsync_opt.serving.plan import ServingPlan
from qsync_opt.serving.spec import ServingJob
from qsync_opt.training.plan import Plan
from qsync_opt.training.spec import JobSpec

__version__ = "0.1.0"
__all__ = ["solve", "run", "load_spec", "load_plan", "KINDS", "JobSpec", "ServingJob", "Plan", "ServingPlan",
           "RolloutPlan", "QSyncError", "SpecError", "InfeasibleError", "__version__"]
