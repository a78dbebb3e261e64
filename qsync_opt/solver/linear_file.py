"""MPS and LP files of a Problem, written so stock solvers get our optimum, and read back.

The objective is written *scaled* (the compiler's power of two, exact in floating point):
in plan units, indicator costs span many decades, down under the absolute tolerances of
HiGHS and CBC, which then return plans far from the optimum and call them optimal (docs/program.md).
Scaled, the largest cost is about 2**20, and a solver with default settings finds the
optimum. The unit (multiply the solver's objective by it to get plan units) is written in a
comment at the top of the file (`* objective_unit = ...` in MPS, `\\ objective_unit = ...` in
LP) and in the JSON twin. The objective constant rides on a variable fixed at 1 (PuLP's
writers drop constants). Coefficients carry PuLP's 12 significant digits.

Reading (`solve --problem p.mps`) goes through highspy's reader; rows and columns become a
Problem whose linearised products are plain continuous variables. With the JSON twin beside
the file, the decode map and the instance come from it, so the plan is decoded and checked.
"""

from __future__ import annotations

import math
import os
import re

from qsync_opt.errors import SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.solver.backends.linear import linearize
from qsync_opt.solver.backends.pulp_model import build_pulp
from qsync_opt.solver.backends.quiet import swallow_highs_banner
from qsync_opt.solver.export import read_json
from qsync_opt.solver.problem import Problem

_UNIT = re.compile(r"^[*\\]\s*objective_unit\s*=\s*(\S+)\s*$", re.M)


def write_linear(problem: Problem, path: str, formulation: str = "mccormick") -> None:
    """Free MPS (.mps) or CPLEX LP (.lp) of the linearised, scaled model, unit in a comment."""
    import tempfile

    ext = os.path.splitext(path)[1].lower()
    prob = _pulp_scaled(problem, formulation)
    fd, tmp = tempfile.mkstemp(suffix=ext, prefix=".qsync_")
    os.close(fd)
    try:
        (prob.writeMPS if ext == ".mps" else prob.writeLP)(tmp)
        with open(tmp, encoding="utf-8") as f:
            body = f.read()
    finally:
        os.unlink(tmp)
    mark = "*" if ext == ".mps" else "\\"
    head = (
        f"{mark} qsync-opt problem {problem.name}: the objective is scaled; multiply the solver's objective\n"
        f"{mark} by objective_unit for plan units (also in the JSON twin {os.path.basename(os.path.splitext(path)[0])}.json)\n"
        f"{mark} objective_unit = {problem.objective_unit!r}\n"
    )
    atomic_write_text(path, head + body)


def objective_unit_of(path: str) -> float:
    """The unit written in a file's header comment (1.0 for files that have none)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        m = _UNIT.search(f.read(4096))
    return float(m.group(1)) if m else 1.0


def _pulp_scaled(problem: Problem, formulation: str):
    import pulp

    model = linearize(problem, formulation)
    prob, xs = build_pulp(model, problem.name)
    terms = [(xs[v], c) for v, c in model.objective.items()]
    if model.objective_constant:  # PuLP's writers drop objective constants: carry it on a variable fixed at 1
        terms.append((prob.add_variable("objective_constant", lowBound=1, upBound=1), model.objective_constant))
    prob.setObjective(pulp.LpAffineExpression(terms))
    return prob


def read_linear(path: str) -> Problem:
    """A Problem from an MPS/LP file (any solver's, or ours with its unit and JSON twin)."""
    import highspy

    swallow_highs_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    if h.readModel(path) != highspy.HighsStatus.kOk:
        raise SpecError(f"problem file {path!r}: HiGHS could not read it as {os.path.splitext(path)[1]}; check the file")
    lp = h.getLp()
    if lp.sense_ != highspy.ObjSense.kMinimize:
        raise SpecError(f"problem file {path!r}: objective sense is maximise; qsync-opt problems minimise")
    names = list(lp.col_names_)
    p = Problem(name=os.path.splitext(os.path.basename(path))[0], objective_unit=objective_unit_of(path))
    for j, n in enumerate(names):
        lo, hi = float(lp.col_lower_[j]), float(lp.col_upper_[j])
        integer = lp.integrality_ and lp.integrality_[j] != highspy.HighsVarType.kContinuous
        kind = "binary" if integer and lo >= 0 and hi <= 1 else ("integer" if integer else "continuous")
        p.add_var(n, kind, -math.inf if lo <= -highspy.kHighsInf else lo, math.inf if hi >= highspy.kHighsInf else hi)
    p.objective = {n: float(c) for n, c in zip(names, lp.col_cost_) if c}
    p.objective_constant = float(lp.offset_)
    rows: list[dict[str, float]] = [{} for _ in range(lp.num_row_)]
    a = lp.a_matrix_
    for j in range(lp.num_col_):  # HiGHS keeps the matrix column-wise after reading
        for k in range(a.start_[j], a.start_[j + 1]):
            rows[a.index_[k]][names[j]] = float(a.value_[k])
    row_names = list(lp.row_names_) or [f"r{i}" for i in range(lp.num_row_)]
    for i, coeffs in enumerate(rows):
        lo, hi = float(lp.row_lower_[i]), float(lp.row_upper_[i])
        if lo == hi:
            p.add_constraint(row_names[i], coeffs, "==", lo)
            continue
        if hi < highspy.kHighsInf:
            p.add_constraint(row_names[i], coeffs, "<=", hi)
        if lo > -highspy.kHighsInf:
            p.add_constraint(row_names[i] + ("_lo" if hi < highspy.kHighsInf else ""), coeffs, ">=", lo)
    twin = os.path.splitext(path)[0] + ".json"
    if os.path.exists(twin):
        src = read_json(twin)
        p.choices = {v: c for v, c in src.choices.items() if v in p.variables}
        p.fixed, p.source, p.meta = src.fixed, src.source, {**src.meta, "twin": twin}
        if not math.isclose(src.objective_unit, p.objective_unit, rel_tol=1e-12):
            raise SpecError(f"problem file {path!r}: objective_unit {p.objective_unit!r} differs from its twin's "
                            f"{src.objective_unit!r}; re-export both")
    return p
