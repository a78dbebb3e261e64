"""The training kind (QSync): per-operator precisions for synchronous data-parallel training on unlike devices."""

from __future__ import annotations

from qsync_opt.kind import Kind, RunRequest
from qsync_opt.training.pipeline import plan_job
from qsync_opt.training.plan import Plan
from qsync_opt.training.report import print_plan
from qsync_opt.training.run import STAGES
from qsync_opt.training.run import run as run_stages
from qsync_opt.training.spec import JobSpec


def plan(job: JobSpec, budget, export_problem=None) -> Plan:
    return plan_job(job, budget, export_problem=export_problem)


def report(plan: Plan, console, verbose: bool = False) -> None:
    print_plan(plan, console, verbose=verbose)


def run(job: JobSpec, request: RunRequest) -> dict[str, str]:
    stages = run_stages(request.spec_path, request.out, start=request.start, steps=request.steps,
                        emulate=request.emulate)
    return {"report": stages["report"]}


KIND = Kind(
    name="training",
    summary="per-operator precisions and batch split for synchronous data-parallel training on unlike devices "
            "(QSync)",
    job_model=JobSpec,
    example="examples/cpu_tiny.yaml",
    plan=plan,
    report=report,
    load_plan=Plan.load,
    run=run,
    stages=tuple(STAGES),
    run_options=frozenset({"start", "emulate"}),
    exports_problem=True,
)
