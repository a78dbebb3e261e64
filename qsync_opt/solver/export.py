"""Problem files: versioned JSON (lossless, re-solvable without a model), MPS and LP.

JSON keeps the Problem itself — pairs stay pairs, the decode map and, optionally, the
structured instance it came from (its kind registers a codec here: `register_source`) — so `solve --problem out.json` can solve, decode and check
a plan with no model at hand. Floats go through `repr` and back: bit-exact. MPS and LP
(linear_file.py) hold one linearisation, written scaled, with a JSON twin beside them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from qsync_opt.errors import SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.solver.problem import Constraint, OneHot, PairTerm, Problem, Variable

FORMAT = "qsync-opt-problem"
VERSION = 1

#: instance kind -> (its type, to plain data, from plain data); each problem kind registers its own.
SOURCE_CODECS: dict[str, tuple[type, Callable[[Any], dict], Callable[[dict], Any]]] = {}
#: instance type -> its heuristic (the `greedy` backend's plan), registered beside the codec.
HEURISTICS: dict[type, Callable[[Any], Any]] = {}
DEFAULT_SOURCE_KIND = "training"
"""Files written before instances carried a kind hold a training instance."""


def register_source(kind: str, type_: type, to_dict: Callable[[Any], dict], from_dict: Callable[[dict], Any],
                    heuristic: Callable[[Any], Any] | None = None) -> None:
    """Let problem files carry instances of `type_` (and the greedy backend run `heuristic` on them)."""
    SOURCE_CODECS[kind] = (type_, to_dict, from_dict)
    if heuristic is not None:
        HEURISTICS[type_] = heuristic


def heuristic_for(source: Any) -> Callable[[], Any] | None:
    """The registered heuristic bound to `source`, or None (no source, or none registered)."""
    fn = next((h for t, h in HEURISTICS.items() if isinstance(source, t)), None)
    return None if fn is None else (lambda: fn(source))


def _source_to_dict(source: Any) -> tuple[str, dict]:
    for kind, (type_, to_dict, _) in SOURCE_CODECS.items():
        if isinstance(source, type_):
            return kind, to_dict(source)
    raise SpecError(f"problem source of type {type(source).__name__} has no registered codec; export with with_instance=False")


def _source_from_dict(kind: str, data: dict) -> Any:
    if kind not in SOURCE_CODECS:
        raise SpecError(f"problem file: instance kind {kind!r} is not known here (known: {', '.join(SOURCE_CODECS) or 'none'})")
    return SOURCE_CODECS[kind][2](data)


# ---- JSON ---------------------------------------------------------------------------------
def problem_to_dict(problem: Problem, with_instance: bool = True) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": problem.name,
        "variables": [{"name": v.name, "kind": v.kind, "lb": num(v.lb), "ub": num(v.ub)} for v in problem.variables.values()],
        "pairs": [{"name": p.name, "a": p.a, "b": p.b} for p in problem.pairs.values()],
        "onehots": [{"name": o.name, "variables": list(o.variables)} for o in problem.onehots],
        "constraints": [{"name": c.name, "sense": c.sense, "rhs": num(c.rhs), "coeffs": c.coeffs} for c in problem.constraints],
        "objective": problem.objective,
        "objective_constant": problem.objective_constant,
        "objective_unit": problem.objective_unit,
        "choices": {v: list(c) for v, c in problem.choices.items()},
        "fixed": problem.fixed,
        "meta": problem.meta,
        **_instance_fields(problem.source if with_instance else None),
    }


def _instance_fields(source: Any) -> dict[str, Any]:
    if source is None:
        return {"instance": None}
    kind, data = _source_to_dict(source)
    return {"instance": data, "instance_kind": kind}


def problem_from_dict(data: dict[str, Any]) -> Problem:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise SpecError(f"format: {got!r}; expected {FORMAT!r} (write the file with export.write_json)")
    if data.get("version") != VERSION:
        raise SpecError(f"version: {data.get('version')!r}; this qsync-opt reads version {VERSION}; re-export the problem")
    try:
        p = Problem(
            name=data["name"],
            variables={v["name"]: Variable(v["name"], v["kind"], unnum(v["lb"]), unnum(v["ub"])) for v in data["variables"]},
            pairs={q["name"]: PairTerm(q["name"], q["a"], q["b"]) for q in data["pairs"]},
            onehots=[OneHot(o["name"], tuple(o["variables"])) for o in data["onehots"]],
            constraints=[Constraint(c["name"], dict(c["coeffs"]), c["sense"], unnum(c["rhs"])) for c in data["constraints"]],
            objective=dict(data["objective"]),
            objective_constant=data["objective_constant"],
            objective_unit=data["objective_unit"],
            choices={v: tuple(c) for v, c in data["choices"].items()},
            fixed=data["fixed"],
            meta=data.get("meta", {}),
            source=_source_from_dict(data.get("instance_kind", DEFAULT_SOURCE_KIND), data["instance"]) if data.get("instance") else None,
        )
    except (KeyError, TypeError) as e:
        raise SpecError(f"problem file: missing or malformed field {e}; re-export the problem") from None
    p.validate()
    return p


def write_json(problem: Problem, path: str, with_instance: bool = True) -> None:
    atomic_write_text(path, json.dumps(problem_to_dict(problem, with_instance), indent=1, allow_nan=False))


def read_json(path: str) -> Problem:
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise SpecError(f"{path}: not JSON ({e}); give a file written by export.write_json") from None
    return problem_from_dict(data)


# ---- helpers ------------------------------------------------------------------------------
def num(x: float) -> float | str:
    """A float as JSON can hold it (infinities as strings)."""
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def unnum(x) -> float:
    return float(x) if isinstance(x, str) else x
