"""qsync-opt: mixed-precision plans for clusters of unlike accelerators.

    import qsync_opt
    plan = qsync_opt.solve("examples/hybrid_v100_t4_resnet50.yaml")
    plan.to_fqn_config("t4")    # {'conv1': 'fp16', 'layer1.0.conv1': 'int8', ...}
"""

from qsync_opt.errors import InfeasibleError, QSyncError, SpecError
from qsync_opt.jobs import load_spec
from qsync_opt.serving.plan import ServingPlan
from qsync_opt.serving.spec import ServingJob
from qsync_opt.training.plan import Plan
from qsync_opt.training.spec import JobSpec

__version__ = "0.1.0"
__all__ = ["solve", "load_spec", "JobSpec", "ServingJob", "Plan", "ServingPlan", "QSyncError", "SpecError", "InfeasibleError", "__version__"]


def solve(spec_or_path, **overrides) -> Plan:
    """Plan a job spec of any kind (path, YAML text, dict or job model); see `qsync_opt.jobs.solve`.

    A `kind: serving` spec gives a `qsync_opt.serving.plan.ServingPlan` instead of a Plan.
    """
    from qsync_opt.jobs import solve as _solve

    return _solve(spec_or_path, **overrides)
