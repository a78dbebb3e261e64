"""The serving kind (LLM-PQ): layer partition, per-layer bits and micro-batch sizes for an LLM on a pipeline of
unlike GPUs.

`run` plans and writes the plan and its report; serving the plan on real devices is not part of it yet.
"""

from __future__ import annotations

import io

from rich.console import Console

from qsync_opt.io import atomic_write_text
from qsync_opt.kind import Kind, RunRequest
from qsync_opt.serving.plan import ServingPlan
from qsync_opt.serving.planner import plan_serving
from qsync_opt.serving.profile import cli_profile
from qsync_opt.serving.report import print_serving_plan
from qsync_opt.serving.spec import ServingJob


def plan(job: ServingJob, budget, export_problem=None) -> ServingPlan:
    return plan_serving(job, budget)


def report(plan: ServingPlan, console, verbose: bool = False) -> None:
    print_serving_plan(plan, console)


def run(job: ServingJob, request: RunRequest) -> dict[str, str]:
    """solve -> report: OUT/plan.json and OUT/report.md (the plan as `qsync-opt solve` prints it)."""
    out = request.out
    out.mkdir(parents=True, exist_ok=True)
    made = plan(job, KIND.budget(job))
    paths = {"plan": str(made.save(out / "plan.json"))}
    buf = io.StringIO()
    report(made, Console(file=buf, width=120, color_system=None, highlight=False))
    printed = "\n".join(line.rstrip() for line in buf.getvalue().rstrip().splitlines())
    text = f"# {job.name}: serving plan\n\n```\n{printed}\n```\n"
    paths["report"] = str(atomic_write_text(out / "report.md", text))
    if request.console is not None:
        report(made, request.console)
    return paths


KIND = Kind(
    name="serving",
    summary="layer partition, per-layer bit-widths and micro-batch sizes for an LLM on a pipeline of unlike GPUs "
            "(LLM-PQ)",
    job_model=ServingJob,
    example="examples/serving_opt30b_t4_v100.yaml",
    plan=plan,
    report=report,
    load_plan=ServingPlan.load,
    run=run,
    stages=("solve", "report"),
    profile=cli_profile,
)
