"""Problem files by suffix: .json (export.py, lossless and re-solvable), .mps and .lp
(linear_file.py, one linearisation, with a JSON twin beside them)."""

from __future__ import annotations

import contextlib
import json
import os

from qsync_opt.errors import SpecError
from qsync_opt.solver.export import read_json, write_json
from qsync_opt.solver.linear_file import read_linear, write_linear
from qsync_opt.solver.problem import Problem
from qsync_opt.spec.load import plan_kind, read_text_file


def save_problem(problem: Problem, path: str, formulation: str = "mccormick") -> None:
    """Write `problem` in the format its suffix names: .json (re-solvable), .mps or .lp.

    An .mps or .lp file gets its JSON twin beside it (same name, .json): the decode map and the
    instance, so `solve --problem p.mps` can turn the MPS optimum back into a checked plan.
    """
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
    text = read_text_file(path, "problem file", "a problem written by `qsync-opt solve SPEC --export-problem p.json`")
    if ext in (".mps", ".lp"):
        return read_linear(path)
    if ext in (".yaml", ".yml"):
        raise SpecError(f"problem file {path!r}: a .yaml file is a job spec (solve it with `qsync-opt solve {path}`); "
                        "--problem takes a saved problem: .json, .mps or .lp")
    if ext != ".json":
        raise SpecError(f"problem file {path!r}: suffix {ext or '(none)'!r} unknown; use .json, .mps or .lp")
    kind = None
    with contextlib.suppress(ValueError):  # not JSON: read_json says so
        kind = plan_kind(json.loads(text))
    if kind is not None:
        raise SpecError(f"problem file {path!r} is a {kind} plan written by `qsync-opt solve`, not a saved "
                        "problem; write one with `qsync-opt solve SPEC --export-problem p.json`")
    return read_json(path)
