"""The problem kinds behind one entry point: `load_spec` reads a spec of any kind, `solve` plans it.

A spec's `kind:` (default `training`) picks the job model that validates it and the planner
that solves it. This is the only module that knows every kind; each kind knows none of the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from pydantic import BaseModel

from qsync_opt.errors import SpecError
from qsync_opt.rollout.spec import RolloutJob
from qsync_opt.serving.spec import ServingJob
from qsync_opt.solver.budget import Budget
from qsync_opt.spec.load import Override, kind_of, read_document, validate
from qsync_opt.training.spec import JobSpec

if TYPE_CHECKING:
    from qsync_opt.rollout.plan import RolloutPlan
    from qsync_opt.serving.plan import ServingPlan
    from qsync_opt.training.plan import Plan

#: kind -> the job model its specs validate against.
JOB_MODELS: dict[str, type[BaseModel]] = {"training": JobSpec, "serving": ServingJob, "rollout": RolloutJob}
KINDS = tuple(JOB_MODELS)

AnyJob = Union[JobSpec, ServingJob, RolloutJob]

SOLVER_SHORTHANDS = ("backend", "time_limit_s", "rel_gap", "threads", "seed")


def load_spec(source: "str | Path | dict | BaseModel", **overrides: Any) -> AnyJob:
    """Parse and validate a spec of any kind from a path, a YAML string, a dict or a job model.

    `overrides` use dotted paths, e.g. `load_spec(p, **{"solver.backend": "cbc"})`; a value may be an
    `Override` naming its source (a CLI flag), which an error in it then blames.
    """
    if isinstance(source, tuple(JOB_MODELS.values())) and not overrides:
        return source
    data, text, origin = read_document(source)
    kind = kind_of(data, origin, KINDS)
    if kind == "rollout":
        for dotted, value in overrides.items():
            if dotted.startswith("solver."):
                given = value.source if isinstance(value, Override) else f"override {dotted}={value!r}"
                raise SpecError(f"{given}: a rollout spec has no top-level solver (its policies are simulated); the "
                                "repack program's solver is rollout.solver (backend: highs | cbc | scip | cpsat, "
                                f"time_limit_s per decision): set it in {origin}")
    return validate(JOB_MODELS[kind], data, text, origin, overrides)


def solve(spec_or_path: "str | Path | dict | BaseModel", *, export_problem: "str | Path | None" = None,
          **overrides: Any) -> "Plan | ServingPlan | RolloutPlan":
    """Plan a job: the public entry point for users (a path) and schedulers (a job model or dict).

    `overrides` take dotted spec paths, e.g. `solve("job.yaml", **{"solver.backend": "cbc"})`;
    plain keywords `backend`, `time_limit_s`, `rel_gap`, `threads`, `seed` are shorthands for
    the solver section. A training spec gives a `Plan`, a serving spec a `ServingPlan`, a rollout
    spec a `RolloutPlan` (every policy simulated, one recommended).
    """
    for short in SOLVER_SHORTHANDS:
        if short in overrides:
            value = overrides.pop(short)
            overrides[f"solver.{short}"] = (value if isinstance(value, Override)
                                            else Override(value, f"override {short}={value!r}"))
    spec = load_spec(spec_or_path, **overrides)
    if isinstance(spec, ServingJob):
        from qsync_opt.serving.planner import plan_serving

        if export_problem is not None:
            raise SpecError("--export-problem is for training specs; a serving plan solves one program per order "
                            "and micro-batch pair")
        return plan_serving(spec, Budget(spec.solver.time_limit_s))
    if isinstance(spec, RolloutJob):
        from qsync_opt.rollout.plan import solve as solve_rollout

        if export_problem is not None:
            raise SpecError("--export-problem is for training specs; a rollout plan simulates every policy")
        return solve_rollout(spec, Budget.unlimited())
    from qsync_opt.training.pipeline import plan_job

    return plan_job(spec, Budget(spec.solver.time_limit_s), export_problem=export_problem)
