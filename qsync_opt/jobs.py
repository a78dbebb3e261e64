"""The registry of problem kinds, and the entry points that go through it: `load_spec`, `solve`, `run`, `report`.

A spec's `kind:` (default `training`) names a registered `Kind` (qsync_opt/kind.py): its job model validates the
spec, its planner solves it, its report prints the plan, its run goes through its stages. Adding a kind is a folder
with a `kind.py` that defines `KIND`, plus one entry in `KIND_MODULES` below. This is the only module that knows every kind;
each kind knows none of the others.
"""

from __future__ import annotations

from collections.abc import Mapping
import importlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from qsync_opt.errors import SpecError
from qsync_opt.kind import RUN_FLAGS, Kind, Planned, RunRequest
from qsync_opt.spec.load import Override, kind_of, plan_kind, read_document, read_text_file, validate

KIND_MODULES: dict[str, str] = {
    "training": "qsync_opt.training.kind",
    "serving": "qsync_opt.serving.kind",
    "rollout": "qsync_opt.rollout.kind",
    "loading": "qsync_opt.loading.kind",
}
"""kind name -> the module that defines its `KIND`, in the order `qsync-opt spec` documents them (the default
kind first)."""


class _Registry(Mapping):
    """KIND_MODULES as a mapping name -> Kind that imports a kind's module when that kind is first looked up.

    Only the kind a spec names is imported: a scheduler that plans a serving, rollout or loading job never
    imports the training kind, and with it torch (tests/jobs/test_kinds_import.py)."""

    def __getitem__(self, name: str) -> Kind:
        if name not in KIND_MODULES:
            raise KeyError(name)
        k = importlib.import_module(KIND_MODULES[name]).KIND
        if k.name != name:
            raise RuntimeError(f"{KIND_MODULES[name]}.KIND is named {k.name!r}, registered as {name!r}")
        return k

    def __iter__(self):
        return iter(KIND_MODULES)

    def __len__(self) -> int:
        return len(KIND_MODULES)


KINDS: Mapping[str, Kind] = _Registry()
"""kind name -> Kind (imported on first lookup), in the order of KIND_MODULES."""

SOLVER_SHORTHANDS = ("backend", "time_limit_s", "rel_gap", "threads", "seed")


def kind(name: str) -> Kind:
    """The registered kind `name`; SpecError listing the kinds when there is none."""
    if name not in KINDS:
        raise SpecError(f"kind: {name!r} is not a kind; kinds: {', '.join(KINDS)}")
    return KINDS[name]


def kind_of_file(spec_path: "str | Path") -> str:
    """The `kind:` of the spec at `spec_path` (default training), read without validating the rest."""
    data, _, origin = read_document(spec_path)
    return kind_of(data, origin, tuple(KINDS))


def kind_of_job(job: BaseModel) -> Kind:
    """The kind whose job model `job` is (the kind of the package that defines its class is tried first, so that
    only that kind is imported)."""
    home = type(job).__module__.split(".")
    first = [home[1]] if len(home) > 2 and home[0] == "qsync_opt" and home[1] in KIND_MODULES else []
    for name in first + [n for n in KIND_MODULES if n not in first]:
        k = KINDS[name]
        if isinstance(job, k.job_model):
            return k
    raise SpecError(f"a {type(job).__name__} is not the job model of any kind; kinds: {', '.join(KINDS)}")


def load_spec(source: "str | Path | dict | BaseModel", **overrides: Any) -> BaseModel:
    """Parse and validate a spec of any kind from a path, a YAML string, a dict or a job model.

    `overrides` use dotted paths, e.g. `load_spec(p, **{"solver.backend": "cbc"})`; a value may be an
    `Override` naming its source (a CLI flag), which an error in it then blames.
    """
    if isinstance(source, BaseModel) and not overrides:
        kind_of_job(source)  # a job model of a registered kind, else a SpecError
        return source
    data, text, origin = read_document(source)
    k = kind(kind_of(data, origin, tuple(KINDS)))
    if k.no_solver_section is not None:
        for dotted, value in overrides.items():
            if dotted.startswith("solver."):
                given = value.source if isinstance(value, Override) else f"override {dotted}={value!r}"
                raise SpecError(f"{given}: a {k.name} spec has no top-level solver ({k.no_solver_section}): set it "
                                f"in {origin}")
    return validate(k.job_model, data, text, origin, overrides)


def solve(spec_or_path: "str | Path | dict | BaseModel", *, export_problem: "str | Path | None" = None,
          **overrides: Any) -> Planned:
    """Plan a job: the public entry point for users (a path) and schedulers (a job model or dict).

    `overrides` take dotted spec paths, e.g. `solve("job.yaml", **{"solver.backend": "cbc"})`;
    plain keywords `backend`, `time_limit_s`, `rel_gap`, `threads`, `seed` are shorthands for
    the solver section. The plan is the kind's: a training spec gives a `Plan`, a serving spec a
    `ServingPlan`, a rollout spec a `RolloutPlan` (every policy simulated, one recommended). One
    `Budget` (the spec's solver time limit) bounds every solver run the plan makes.
    """
    for short in SOLVER_SHORTHANDS:
        if short in overrides:
            value = overrides.pop(short)
            overrides[f"solver.{short}"] = (value if isinstance(value, Override)
                                            else Override(value, f"override {short}={value!r}"))
    job = load_spec(spec_or_path, **overrides)
    k = kind_of_job(job)
    if export_problem is not None and not k.exports_problem:
        exporting = ", ".join(n for n, x in KINDS.items() if x.exports_problem)
        raise SpecError(f"--export-problem: a {k.name} plan has no one integer program to save (kinds that do: "
                        f"{exporting})")
    return k.plan(job, k.budget(job), export_problem=export_problem)


def run(spec_path: "str | Path", out: "str | Path", **options: Any) -> dict[str, str]:
    """`qsync-opt run`: the spec's kind goes through its stages into `out`; returns artefact -> path.

    `options` are `RunRequest` fields (steps, start, emulate, real, rounds, console); one the kind does not
    honour (`Kind.run_options`) is refused, naming its flag."""
    k = kind(kind_of_file(spec_path))
    request = RunRequest(spec_path=str(spec_path), out=Path(out), **options)
    for field, flag in RUN_FLAGS.items():
        if getattr(request, field) != getattr(RunRequest, field, None) and field not in k.run_options:
            takes = sorted(RUN_FLAGS[f] for f in k.run_options)
            raise SpecError(f"{flag}: a {k.name} run does not take it (its stages: {', '.join(k.stages)}; "
                            f"its flags: {', '.join(['--steps', *takes])}); drop {flag}")
    job = load_spec(spec_path)
    return k.run(job, request)


def load_plan(path: "str | Path") -> tuple[Kind, Planned]:
    """The kind and the plan of a plan file any kind's `plan.save` wrote."""
    text = read_text_file(Path(path), "plan file", "a plan written by `qsync-opt solve SPEC -o plan.json`")
    try:
        data = yaml.safe_load(text) if str(path).endswith((".yaml", ".yml")) else json.loads(text)
    except (ValueError, yaml.YAMLError) as e:
        raise SpecError(f"plan file {str(path)!r} cannot be read ({type(e).__name__}: {e}); it may be truncated "
                        "or corrupted: write it again with `qsync-opt solve SPEC -o FILE`") from None
    name = plan_kind(data)
    if name is None:
        raise SpecError(f"plan file {str(path)!r} is not a plan of any kind ({', '.join(KINDS)}); write one with "
                        "`qsync-opt solve SPEC -o plan.json`")
    k = kind(name)
    return k, k.load_plan(path)
