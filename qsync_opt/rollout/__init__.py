"""RL rollouts on a hybrid fleet (Laminar): spec, costs, repack program, simulator, plan, Ray run.

Public surface (what the CLI calls):

* ``load_rollout_spec(source) -> RolloutJob`` (SpecError naming the field on bad input)
* ``solve(job, steps=None) -> RolloutPlan``: every policy simulated, one recommended (``plan.to_json()``)
* ``print_plan(plan, console)``: rich tables
* ``simulate(job, variant=None, ...) -> SimResult``
* ``write_report(job, out_dir) -> {"timeline": png, "kv": png}``
* ``run_report(job, out_dir) -> (RolloutPlan, paths)``: ``qsync-opt run`` on a rollout spec (plan, PNGs, report.md)
* ``run(job, out_dir, ...) -> RunResult``: the real run with Ray actors (needs ray; SpecError otherwise)
* ``repack(state) -> RepackResult``: the per-tick library call
"""

from importlib import import_module

_LAZY = {  # name -> module: imported on first use, so that reading any spec does not import the simulator
    "RolloutPlan": "plan", "print_plan": "report", "solve": "plan", "write_report": "run_report", "run_report": "run_report",
    "RepackState": "repack", "RepackTraj": "repack", "RepackWorker": "repack", "repack": "repack",
    "VARIANTS": "simulate", "SimResult": "simulate", "simulate": "simulate",
    "RolloutJob": "spec", "load_rollout_spec": "spec",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"qsync_opt.rollout.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'qsync_opt.rollout' has no attribute {name!r}")


def run(job, out_dir, **kwargs):
    """Real run with Ray actors (see rollout.ray_run.run)."""
    from qsync_opt.rollout.ray_run import run as _run  # import cost: the simulator, the repack program, torch actors

    return _run(job, out_dir, **kwargs)


__all__ = ["VARIANTS", "RepackState", "RepackTraj", "RepackWorker", "RolloutJob", "RolloutPlan", "SimResult",
           "load_rollout_spec", "print_plan", "repack", "run", "run_report", "simulate", "solve", "write_report"]
