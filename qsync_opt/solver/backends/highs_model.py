"""LinearModel -> highspy.HighsLp as row-wise sparse arrays (the HiGHS backend's and exports' builder).

Columns are the model's variables in declaration order; rows are the one-hots (= 1) and
then the constraints, in order. The objective constant is left out, as solvers report it.
"""

from __future__ import annotations

import math

from qsync_opt.solver.backends.linear import LinearModel


def build_lp(model: LinearModel):
    """(HighsLp, column names). Infinite bounds become highspy's infinity."""
    import highspy  # noqa: I001 (both here: the CLI's parser imports this backend, and neither is needed to parse)
    import numpy as np

    inf = highspy.kHighsInf
    names = list(model.variables)
    index = {n: i for i, n in enumerate(names)}
    n = len(names)
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.col_cost_ = np.array([model.objective.get(v, 0.0) for v in names], dtype=np.float64)
    lp.col_lower_ = np.array([_fin(model.variables[v].lb, inf) for v in names], dtype=np.float64)
    lp.col_upper_ = np.array([_fin(model.variables[v].ub, inf) for v in names], dtype=np.float64)
    integer = highspy.HighsVarType.kInteger
    cont = highspy.HighsVarType.kContinuous
    lp.integrality_ = [cont if model.variables[v].kind == "continuous" else integer for v in names]
    starts, idx, vals, lo, hi = [0], [], [], [], []
    for oh in model.onehots:
        idx.extend(index[v] for v in oh.variables)
        vals.extend([1.0] * len(oh.variables))
        starts.append(len(idx))
        lo.append(1.0)
        hi.append(1.0)
    for c in model.constraints:
        idx.extend(index[v] for v in c.coeffs)
        vals.extend(c.coeffs.values())
        starts.append(len(idx))
        lo.append(c.rhs if c.sense in (">=", "==") else -inf)
        hi.append(c.rhs if c.sense in ("<=", "==") else inf)
    lp.num_row_ = len(lo)
    lp.row_lower_ = np.array(lo, dtype=np.float64)
    lp.row_upper_ = np.array(hi, dtype=np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = n
    lp.a_matrix_.num_row_ = len(lo)
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(idx, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(vals, dtype=np.float64)
    return lp, names


def is_mip(lp) -> bool:
    import highspy

    return any(t != highspy.HighsVarType.kContinuous for t in lp.integrality_)


def _fin(x: float, inf: float) -> float:
    return x if math.isfinite(x) else (inf if x > 0 else -inf)
