"""Problem files: versioned JSON (lossless, re-solvable without a model), MPS and LP.

JSON keeps the Problem itself — pairs stay pairs, the decode map and, optionally, the
TrainingInstance it came from — so `solve --problem out.json` can solve, decode and check
a plan with no model at hand. Floats go through `repr` and back: bit-exact. MPS and LP
(linear_file.py) hold one linearisation, written scaled, with a JSON twin beside them.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from qsync_opt.errors import SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.solver.instance import GroupInstance, TimeRow, TrainingInstance
from qsync_opt.solver.problem import Constraint, OneHot, PairTerm, Problem, Variable

FORMAT = "qsync-opt-problem"
VERSION = 1


# ---- JSON ---------------------------------------------------------------------------------
def problem_to_dict(problem: Problem, with_instance: bool = True) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": problem.name,
        "variables": [{"name": v.name, "kind": v.kind, "lb": _num(v.lb), "ub": _num(v.ub)} for v in problem.variables.values()],
        "pairs": [{"name": p.name, "a": p.a, "b": p.b} for p in problem.pairs.values()],
        "onehots": [{"name": o.name, "variables": list(o.variables)} for o in problem.onehots],
        "constraints": [{"name": c.name, "sense": c.sense, "rhs": _num(c.rhs), "coeffs": c.coeffs} for c in problem.constraints],
        "objective": problem.objective,
        "objective_constant": problem.objective_constant,
        "objective_unit": problem.objective_unit,
        "choices": {v: list(c) for v, c in problem.choices.items()},
        "fixed": problem.fixed,
        "meta": problem.meta,
        "instance": instance_to_dict(problem.source) if with_instance and problem.source is not None else None,
    }


def problem_from_dict(data: dict[str, Any]) -> Problem:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise SpecError(f"format: {got!r}; expected {FORMAT!r} (write the file with export.write_json)")
    if data.get("version") != VERSION:
        raise SpecError(f"version: {data.get('version')!r}; this qsync-opt reads version {VERSION}; re-export the problem")
    try:
        p = Problem(
            name=data["name"],
            variables={v["name"]: Variable(v["name"], v["kind"], _unnum(v["lb"]), _unnum(v["ub"])) for v in data["variables"]},
            pairs={q["name"]: PairTerm(q["name"], q["a"], q["b"]) for q in data["pairs"]},
            onehots=[OneHot(o["name"], tuple(o["variables"])) for o in data["onehots"]],
            constraints=[Constraint(c["name"], dict(c["coeffs"]), c["sense"], _unnum(c["rhs"])) for c in data["constraints"]],
            objective=dict(data["objective"]),
            objective_constant=data["objective_constant"],
            objective_unit=data["objective_unit"],
            choices={v: tuple(c) for v, c in data["choices"].items()},
            fixed=data["fixed"],
            meta=data.get("meta", {}),
            source=instance_from_dict(data["instance"]) if data.get("instance") else None,
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


def save_problem(problem: Problem, path: str, formulation: str = "mccormick") -> None:
    """Write `problem` in the format its suffix names: .json (re-solvable), .mps or .lp.

    An .mps or .lp file gets its JSON twin beside it (same name, .json): the decode map and the
    instance, so `solve --problem p.mps` can turn the MPS optimum back into a checked plan.
    """
    from qsync_opt.solver.linear_file import write_linear

    ext = os.path.splitext(path)[1].lower()
    if ext not in (".json", ".mps", ".lp"):
        raise SpecError(f"problem file {path!r}: suffix {ext or '(none)'!r} unknown; use .json, .mps or .lp")
    if ext != ".json":
        write_linear(problem, path, formulation)
        path = os.path.splitext(path)[0] + ".json"
    write_json(problem, path)


def load_problem(path: str) -> Problem:
    """Read a problem file: JSON as written, or MPS/LP (through linear_file, with its twin if any)."""
    ext = os.path.splitext(path)[1].lower()
    if not os.path.exists(path):
        raise SpecError(f"problem file {path!r} does not exist; write one with `qsync-opt solve SPEC --export-problem {path}`")
    if ext in (".mps", ".lp"):
        from qsync_opt.solver.linear_file import read_linear

        return read_linear(path)
    if ext != ".json":
        raise SpecError(f"problem file {path!r}: suffix {ext or '(none)'!r} unknown; use .json, .mps or .lp")
    return read_json(path)


# ---- TrainingInstance <-> plain data ------------------------------------------------------
def instance_to_dict(inst: TrainingInstance) -> dict[str, Any]:
    return {
        "objective": inst.objective,
        "max_degradation": inst.max_degradation,
        "omega": inst.omega,
        "groups": [
            {
                "name": g.name,
                "share": g.share,
                "allowed": {op: list(ps) for op, ps in g.allowed.items()},
                "time_ms": g.time_ms,
                "mem_bytes": g.mem_bytes,
                "cast_ms": [
                    {"a": a, "b": b, "costs": [[pa, pb, c] for (pa, pb), c in table.items()]} for (a, b), table in g.cast_ms.items()
                ],
                "fixed_ms": g.fixed_ms,
                "fixed_mem_bytes": g.fixed_mem_bytes,
                "time_bound_ms": g.time_bound_ms,
                "mem_capacity_bytes": _num(g.mem_capacity_bytes),
                "sync_rows": [
                    {"name": r.name, "op_ms": r.op_ms, "const_ms": r.const_ms,
                     "cast_ms": [{"a": a, "b": b, "costs": [[pa, pb, c] for (pa, pb), c in t.items()]}
                                 for (a, b), t in r.cast_ms.items()]}
                    for r in g.sync_rows
                ],
            }
            for g in inst.groups
        ],
    }


def instance_from_dict(d: dict[str, Any]) -> TrainingInstance:
    groups = tuple(
        GroupInstance(
            name=g["name"],
            share=g["share"],
            allowed={op: tuple(ps) for op, ps in g["allowed"].items()},
            time_ms=g["time_ms"],
            mem_bytes=g["mem_bytes"],
            cast_ms={(e["a"], e["b"]): {(pa, pb): c for pa, pb, c in e["costs"]} for e in g["cast_ms"]},
            fixed_ms=g["fixed_ms"],
            fixed_mem_bytes=g["fixed_mem_bytes"],
            time_bound_ms=g["time_bound_ms"],
            mem_capacity_bytes=_unnum(g["mem_capacity_bytes"]),
            sync_rows=tuple(
                TimeRow(name=r["name"], op_ms=r["op_ms"], const_ms=r["const_ms"],
                        cast_ms={(e["a"], e["b"]): {(pa, pb): c for pa, pb, c in e["costs"]} for e in r["cast_ms"]})
                for r in g.get("sync_rows", ())
            ),
        )
        for g in d["groups"]
    )
    return TrainingInstance(groups=groups, omega=d["omega"], objective=d["objective"], max_degradation=d["max_degradation"])


# ---- helpers ------------------------------------------------------------------------------
def _num(x: float) -> float | str:
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def _unnum(x) -> float:
    return float(x) if isinstance(x, str) else x
