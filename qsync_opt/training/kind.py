"""The training kind (QSync): per-operator precisions for synchronous data-parallel training on unlike devices."""

from __future__ import annotations

from pathlib import Path

from qsync_opt.kind import Kind, RunRequest
from qsync_opt.training.plan import Plan
from qsync_opt.training.predictor.profile import default_profile_path
from qsync_opt.training.spec import JobSpec

#: training.run.STAGES' names, in order (tests/training/test_training_kind.py holds them equal): the record is read
#: to list every kind's stages (`qsync-opt --help`, `spec`) without importing the runtime.
STAGE_NAMES = ("profile", "indicate", "solve", "predict", "train", "report")


def plan(job: JobSpec, budget, export_problem=None) -> Plan:
    from qsync_opt.training.pipeline import plan_job  # import cost: torch (the model is traced)

    return plan_job(job, budget, export_problem=export_problem)


def report(plan: Plan, console, verbose: bool = False) -> None:
    from qsync_opt.training.report import print_plan  # import cost: rich's tables, only when a plan is printed

    print_plan(plan, console, verbose=verbose)


def run(job: JobSpec, request: RunRequest) -> dict[str, str]:
    from qsync_opt.training.run import run as run_stages  # import cost: torch and the runtime

    stages = run_stages(request.spec_path, request.out, start=request.start, steps=request.steps,
                        emulate=request.emulate)
    return {"report": stages["report"]}


def profile(job: JobSpec, output: "str | None", groups: list[str] | None, console, progress: bool = True) -> None:
    """`qsync-opt profile TRAINING_SPEC [-o FILE] [--groups a,b] [--quiet]`: measure what the profile lacks for
    every group here (training.predictor.profiler), then print its sections and all-reduce fits."""
    from rich.table import Table  # import cost: rich's table, only for this verb

    from qsync_opt.training.predictor import profile_run  # import cost: the profile's stack (no torch: its processes)

    path = Path(output) if output else default_profile_path()
    prof = profile_run.profile_spec(job, path, groups=groups, progress=progress,
                                 log=lambda s: console.print(s, highlight=False))
    t = Table(title=f"profile {path}", title_justify="left")
    for col in ("section", "ops", "casts", "optimizer"):
        t.add_column(col)
    for key, sec in prof.sections.items():
        t.add_row(key, str(len(sec.ops)), str(len(sec.casts)), str(len(sec.optimizer)))
    console.print(t)
    raced = [(key, cls, e) for key, sec in prof.sections.items() for cls, e in sec.dispatch.items()]
    if raced:  # training/predictor/measured_dispatch.py: which implementation won, per shape class
        d = Table(title="measured dispatch (runtime.kernels: auto): fwd+bwd ms per implementation; "
                        "the winner runs and is priced", title_justify="left")
        for col in ("section", "shape class", "runs", "candidates"):
            d.add_column(col)
        for key, cls, e in raced:
            d.add_row(key, cls, e["impl"], ", ".join(f"{k} {_raced_ms(c)}" for k, c in e["candidates"].items()))
        console.print(d)
    for key, fit in prof.allreduce.items():
        if "alpha_ms" in fit:
            console.print(f"all-reduce {key}: {fit['alpha_ms']:.3f} ms + {fit['beta_ms_per_byte'] * 1e6:.3f} ms/MB")
        else:  # allreduce_profile.ddp_key: one whole fp32 DDP step, every rank here at once
            console.print(f"{key}: fp32 DDP step {fit['fp32_ms']:.2f} ms")
    console.print(f"machine: {prof.machine.get('cpu')} ({', '.join(prof.machine.get('isa', []))}); "
                  f"torch {prof.versions.get('torch')}")


def _raced_ms(c: dict) -> str:
    """One candidate of a race as the profile recorded it: its fwd+bwd, or why it was not timed in full."""
    if "fwd_ms" in c:
        return f"{c['fwd_ms'] + c['bwd_ms']:.3f}"
    if "screen_fwd_ms" in c:
        return f"(fwd {c['screen_fwd_ms']:.3f}: screened out)"
    return f"(cannot run: {c.get('error', '?').split(';')[0].split(' (')[0]})"


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
    stages=STAGE_NAMES,
    run_options=frozenset({"start", "emulate"}),
    exports_problem=True,
    profile=profile,
)
