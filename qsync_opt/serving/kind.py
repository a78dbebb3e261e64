"""The serving kind (LLM-PQ): layer partition, per-layer bits and micro-batch sizes for an LLM on a pipeline of
unlike GPUs.

`run` plans, serves the plan's pipeline for real (one process per stage, serving/pipeline.py) and
writes the plan, the measurements beside the predictions, a timeline and the report (serving/serve.py).
"""

from __future__ import annotations

import io
import json

from rich.console import Console

from typing import TYPE_CHECKING

from qsync_opt.io import atomic_write_text
from qsync_opt.kind import Kind, RunRequest
from qsync_opt.serving.spec import ServingJob

if TYPE_CHECKING:
    from qsync_opt.serving.plan import ServingPlan


def plan(job: ServingJob, budget, export_problem=None) -> ServingPlan:
    from qsync_opt.serving.planner import plan_serving  # import cost: the planner and its solvers, only to plan

    return plan_serving(job, budget)


def report(plan: ServingPlan, console, verbose: bool = False) -> None:
    from qsync_opt.serving.report import print_serving_plan  # import cost: the report, only when one is printed

    print_serving_plan(plan, console)


def load_plan(path) -> ServingPlan:
    from qsync_opt.serving.plan import ServingPlan  # import cost: the plan's model, only when one is read

    return ServingPlan.load(path)


def profile(job: ServingJob, output, groups, console, progress: bool = True) -> None:
    from qsync_opt.serving.profile_report import cli_profile  # import cost: the profiler, only for this verb

    cli_profile(job, output, groups, console, progress=progress)


def run(job: ServingJob, request: RunRequest) -> dict[str, str]:
    """solve -> serve -> report: OUT/plan.json, then the pipeline served for real (OUT/pipeline/), OUT/serve.json,
    OUT/requests.csv, OUT/timeline.png and OUT/report.md (the plan as `qsync-opt solve` prints it, then predicted
    beside measured)."""
    from qsync_opt.serving import serve  # import cost: the served pipeline's stack, only to serve

    out = request.out
    out.mkdir(parents=True, exist_ok=True)
    log = request.console.print if request.console is not None else (lambda *a, **k: None)
    serve.check_present(job)  # devices absent or a checkpoint that is none: exit 2 before anything is written
    serve.model_source(job)
    made = plan(job, KIND.budget(job))
    paths = {"plan": str(made.save(out / "plan.json"))}
    if request.console is not None:
        report(made, request.console)
    log(f"[serve] {len(made.stages)} stage processes, {job.serving.runtime.requests or job.serving.global_batch} "
        "requests", highlight=False)
    served = serve.run_pipeline(job, made, out / "pipeline")
    measured = serve.measure(job, made, served)
    if job.serving.runtime.perplexity_windows:
        log(f"[quality] perplexity of the served model on {job.serving.runtime.perplexity_windows} test windows, "
            "for the plan and every baseline", highlight=False)
        measured["quality"] = serve.quality(job, made)
    paths["measured"] = str(atomic_write_text(out / "serve.json", json.dumps(measured, indent=2)))
    paths["requests"] = str(atomic_write_text(out / "requests.csv", serve.requests_csv(measured)))
    paths["timeline"] = str(serve.timeline(served, made, out / "timeline.png",
                                           f"{job.name}: {measured['tokens_per_s']:.1f} tokens/s measured, "
                                           f"{measured['predicted_tokens_per_s']:.1f} predicted"))
    buf = io.StringIO()
    report(made, Console(file=buf, width=120, color_system=None, highlight=False))
    printed = "\n".join(line.rstrip() for line in buf.getvalue().rstrip().splitlines())
    paths["report"] = str(atomic_write_text(out / "report.md", serve.report_md(job, printed, measured)))
    log(f"[serve] measured {measured['tokens_per_s']:.1f} tokens/s (predicted {measured['predicted_tokens_per_s']:.1f}), "
        f"time to first token p50 {measured['ttft_ms_p50']:.1f} ms", highlight=False)
    log(f"[serve] {measured['verdict']}", highlight=False)
    return paths


KIND = Kind(
    name="serving",
    summary="layer partition, per-layer bit-widths and micro-batch sizes for an LLM on a pipeline of unlike GPUs "
            "(LLM-PQ)",
    job_model=ServingJob,
    example="examples/serving_opt30b_t4_v100.yaml",
    plan=plan,
    report=report,
    load_plan=load_plan,
    run=run,
    stages=("solve", "serve", "report"),
    profile=profile,
)
