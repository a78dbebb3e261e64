"""What a problem kind is: the one interface `jobs` and every CLI verb go through.

A kind is a folder (its spec model, planner, report and run) plus one `Kind` record that the
registry in `qsync_opt/jobs.py` lists. `solve`, `spec`, `run` and `report` are lookups: nothing
above the kinds branches on which kind a spec or plan is.

    kind.job_model       validates a spec whose `kind:` is `kind.name`
    kind.plan(job, budget, export_problem=None)   -> a plan (`Planned`)
    kind.report(plan, console, verbose=False)     prints a plan for a reader
    kind.run(job, RunRequest)                     -> {artefact: path}, the stages in `kind.stages`
    kind.load_plan(path)                          reads a plan file `plan.save` wrote

A plan file is recognised as a kind's by the keys `qsync_opt.spec.load.PLAN_MARKS` lists for it (a shared layer
that refuses a plan given where a spec belongs); tests/test_kinds.py checks every registered kind has its entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from qsync_opt.solver.budget import Budget


@runtime_checkable
class Planned(Protocol):
    """What every kind's plan offers the verbs: its file forms and whether it meets the spec's bounds."""

    meets_bounds: bool

    def to_json(self) -> str: ...

    def save(self, path: "str | Path") -> Path: ...


@dataclass(frozen=True)
class RunRequest:
    """`qsync-opt run SPEC -o OUT [...]` as a kind's run reads it. Options a kind does not list in
    `Kind.run_options` are refused by the CLI before the kind is called."""

    spec_path: str
    out: Path
    steps: int | None = None
    start: str | None = None
    """--from: rerun from this stage (a kind with cached stages)."""
    emulate: bool = False
    real: bool = False
    """--real: also run for real here, beside the planned figures."""
    rounds: int = 1
    console: Any = None
    """A rich Console for progress and the printed plan (None: the kind prints nothing)."""


RUN_FLAGS: Mapping[str, str] = {"start": "--from", "emulate": "--emulate", "real": "--real", "rounds": "--rounds"}
"""RunRequest fields a kind may honour -> the `run` flag that sets them (`--steps` every kind takes)."""


@dataclass(frozen=True)
class Kind:
    """One problem kind, registered in `qsync_opt.jobs.KINDS`."""

    name: str
    """The spec's `kind:` value."""
    summary: str
    """One line: what a plan of this kind decides."""
    job_model: type[BaseModel]
    """Validates the spec (pydantic); `qsync-opt spec --kind NAME` documents its fields."""
    example: str
    """A spec of this kind in the repository's examples/ that `solve` plans in seconds on a CPU."""
    plan: Callable[..., Planned]
    """`plan(job, budget, export_problem=None)`: the planner, drawing every solver second from `budget`."""
    report: Callable[..., None]
    """`report(plan, console, verbose=False)`: print a plan for a reader."""
    load_plan: Callable[[str | Path], Planned]
    """Read a plan file this kind's `plan(...).save(path)` wrote."""
    run: Callable[[BaseModel, RunRequest], dict[str, str]]
    """`run(job, request)`: the stages, each artefact written into request.out; returns stage -> path."""
    stages: tuple[str, ...]
    """The stages `run` goes through, in order."""
    run_options: frozenset[str] = field(default_factory=frozenset)
    """RunRequest fields (keys of RUN_FLAGS) this kind's run honours."""
    no_solver_section: str | None = None
    """None when the spec has a top-level `solver:` (the CLI's --backend/--time-limit/--gap set it); else why not
    and where its solver settings are, which a `solver.*` override is refused with."""
    exports_problem: bool = False
    """Whether `plan` can also save its integer program (`solve --export-problem`)."""
    progress_log: str | None = None
    """A logger whose INFO lines the CLI shows while this kind plans or runs (None: none)."""
    profile: Callable[..., None] | None = None
    """`profile(job, output, groups, console, progress=True)`: `qsync-opt profile SPEC` for this kind (measure this
    machine's devices for the job's costs, cache and print them; `progress`: show a progress bar); None: nothing to
    measure."""
    time_limit_s: Callable[[BaseModel], float] = field(default=lambda job: job.solver.time_limit_s)
    """The seconds of solver time a plan of `job` may spend in all (its one Budget)."""

    def budget(self, job: BaseModel) -> Budget:
        limit = self.time_limit_s(job)
        return Budget(math.inf if limit is None else float(limit))
