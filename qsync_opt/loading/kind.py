"""The loading kind (Omniload): each global batch of a weighted mix of sources split over ranks of unequal speed
by the data plane's balancer; `run` serves the batches to the ranks through the data plane."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qsync_opt.kind import Kind, RunRequest
from qsync_opt.loading.spec import LoadingJob

if TYPE_CHECKING:
    from qsync_opt.loading.plan import LoadingPlan

STAGES = ("plan", "serve", "report")
"""`run`'s stages (qsync_opt.loading.serve.run_loading)."""


def plan(job: LoadingJob, budget, export_problem=None) -> LoadingPlan:
    from qsync_opt.loading.planner import plan_loading  # import cost: the planner and its solvers, only to plan

    return plan_loading(job, budget)


def report(plan: LoadingPlan, console, verbose: bool = False) -> None:
    from qsync_opt.loading.report import print_loading_plan  # import cost: the report, only when one is printed

    print_loading_plan(plan, console)


def load_plan(path) -> LoadingPlan:
    from qsync_opt.loading.plan import LoadingPlan  # import cost: the plan's model, only when one is read

    return LoadingPlan.load(path)


def run(job: LoadingJob, request: RunRequest) -> dict[str, str]:
    """plan -> serve -> report: OUT/plan.json, OUT/served.csv (per step and rank: samples, tokens, predicted and
    read seconds, the ids) and OUT/report.md; `--steps` sets how many global batches are served."""
    from qsync_opt.loading.serve import run_loading  # import cost: the data plane, only to serve

    return run_loading(job, request.out, steps=request.steps, console=request.console, budget_for=KIND.budget)


KIND = Kind(
    name="loading",
    summary="each global batch of a weighted mix of sources split over data-parallel ranks of unequal speed, "
            "served through the data plane (Omniload)",
    job_model=LoadingJob,
    example="examples/loading_cpu_mix.yaml",
    plan=plan,
    report=report,
    load_plan=load_plan,
    run=run,
    stages=STAGES,
    no_solver_section="each global batch is split by the data plane's balancer: balancer.backend, "
                      "balancer.time_limit_ms per step",
    time_limit_s=lambda job: job.planned_steps * job.balancer.time_limit_ms / 1000.0,
)
