"""The rollout kind (Laminar): every rollout policy simulated on a hybrid fleet, one recommended; `run --real` also
runs them here on Ray actors."""

from __future__ import annotations

import math

from typing import TYPE_CHECKING

from qsync_opt.errors import SpecError
from qsync_opt.kind import Kind, RunRequest
from qsync_opt.rollout.spec import RolloutJob

if TYPE_CHECKING:
    from qsync_opt.rollout.plan import RolloutPlan


def plan(job: RolloutJob, budget, export_problem=None) -> RolloutPlan:
    from qsync_opt.rollout.plan import solve  # import cost: the simulator and the bounds, only to plan

    return solve(job, budget)


def report(plan: RolloutPlan, console, verbose: bool = False) -> None:
    from qsync_opt.rollout.report import print_plan  # import cost: the report, only when one is printed

    print_plan(plan, console)


def load_plan(path) -> RolloutPlan:
    from qsync_opt.rollout.plan import RolloutPlan  # import cost: the plan's model and the simulator's records

    return RolloutPlan.load(path)


def run(job: RolloutJob, request: RunRequest) -> dict[str, str]:
    """The plan (every policy simulated), its timeline and KV-utilisation PNGs and report.md in request.out; with
    `real`, every policy also runs here on Ray actors for `rounds` interleaved rounds (measured.csv)."""
    from qsync_opt.rollout.admission import planned_job  # import cost: the simulator, only to run
    from qsync_opt.rollout.report import print_plan  # import cost: as above
    from qsync_opt.rollout.run_report import run_report, write_measured  # import cost: as above

    if request.steps is not None and request.steps < 1:
        raise SpecError(f"--steps {request.steps}: simulated trainer steps must be at least 1")
    if request.rounds < 1:
        raise SpecError(f"--rounds {request.rounds}: the real run needs at least 1 round")
    if request.steps is not None:  # the plan, the pictures and the real run alike
        job = job.model_copy(update={"rollout": job.rollout.model_copy(update={"steps": request.steps})})
    if request.real:
        from qsync_opt.rollout.ray_run import check_runs_here, need_ray  # import cost: torch actors; ray is an extra

        need_ray()  # the extra is missing: say so before simulating anything
        check_runs_here(job)
    job, notes = planned_job(job, request.steps)  # the plan, the pictures and the real run at the chosen caps
    made, paths = run_report(job, request.out, steps=request.steps, extra_notes=notes)
    out = request.console
    if out is not None:
        print_plan(made, out, real_pending=request.real)
    if request.real:
        if out is not None:
            out.print(f"real run here: {request.rounds} round(s) of every policy on Ray actors ...")
        paths.update(write_measured(job, request.out, request.rounds, out, plan=made))
    return {what: str(paths[what]) for what in ARTEFACTS if what in paths}


ARTEFACTS = ("plan", "timeline", "kv", "report", "measured")
"""What `run` writes, in the order it lists them."""


KIND = Kind(
    name="rollout",
    summary="trajectory-level asynchrony, weight relay and long-tail repack for RL rollouts on a hybrid fleet "
            "(Laminar): every policy simulated, one recommended",
    job_model=RolloutJob,
    example="examples/rollout_cpu_tiny.yaml",
    plan=plan,
    report=report,
    load_plan=load_plan,
    run=run,
    stages=("simulate", "draw", "report"),
    run_options=frozenset({"real", "rounds"}),
    no_solver_section="its policies are simulated; the repack program's solver is rollout.solver (backend: highs | "
                      "cbc | scip | cpsat, time_limit_s per decision)",
    progress_log="qsync_opt.rollout.plan",
    time_limit_s=lambda job: math.inf,  # each repack decision has its own limit: rollout.solver.time_limit_s
)
