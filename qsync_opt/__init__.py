"""qsync-opt: mixed-precision plans for clusters of unlike accelerators.

    import qsync_opt
    plan = qsync_opt.solve("examples/hybrid_v100_t4_resnet50.yaml")
    plan.to_fqn_config("t4")    # {'conv1': 'fp16', 'layer1.0.conv1': 'int8', ...}
"""

from qsync_opt.errors import InfeasibleError, QSyncError, SpecError
from qsync_opt.plan import Plan
from qsync_opt.serving_plan import ServingPlan
from qsync_opt.spec import JobSpec, load_spec

__version__ = "0.1.0"
__all__ = ["solve", "load_spec", "JobSpec", "Plan", "ServingPlan", "QSyncError", "SpecError", "InfeasibleError", "__version__"]


def solve(spec_or_path, **overrides) -> Plan:
    """Plan a job spec (path, YAML text, dict or JobSpec); see `qsync_opt.pipeline.solve`.

    A `kind: serving` spec gives a `qsync_opt.serving_plan.ServingPlan` instead of a Plan.
    """
    from qsync_opt.pipeline import solve as _solve

    return _solve(spec_or_path, **overrides)
