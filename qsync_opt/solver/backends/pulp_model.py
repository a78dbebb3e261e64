"""LinearModel -> pulp.LpProblem: shared by the CBC and HiGHS backends and by MPS/LP export."""

from __future__ import annotations

import math

from qsync_opt.solver.backends.linear import LinearModel

_SENSE = {"<=": -1, ">=": 1, "==": 0}


def build_pulp(model: LinearModel, name: str = "qsync"):
    """(LpProblem, name -> LpVariable). The objective constant stays out; callers add it back."""
    import pulp

    prob = pulp.LpProblem(name, pulp.LpMinimize)
    cat = {"binary": pulp.LpBinary, "integer": pulp.LpInteger, "continuous": pulp.LpContinuous}
    xs = {}
    for v in model.variables.values():
        ub = None if math.isinf(v.ub) else v.ub
        lb = None if math.isinf(v.lb) else v.lb
        xs[v.name] = prob.add_variable(v.name, lowBound=lb, upBound=ub, cat=cat[v.kind])
    prob.setObjective(pulp.LpAffineExpression([(xs[v], c) for v, c in model.objective.items()]))
    for oh in model.onehots:
        expr = pulp.LpAffineExpression([(xs[v], 1.0) for v in oh.variables])
        prob.addConstraint(pulp.LpConstraint(expr, 0, rhs=1.0, name=oh.name))
    for c in model.constraints:
        expr = pulp.LpAffineExpression([(xs[v], a) for v, a in c.coeffs.items()])
        prob.addConstraint(pulp.LpConstraint(expr, _SENSE[c.sense], rhs=c.rhs, name=c.name))
    if not model.objective:  # PuLP drops variables that appear nowhere; keep the objective non-empty
        prob.setObjective(pulp.LpAffineExpression([(next(iter(xs.values())), 0.0)]) if xs else 0)
    return prob, xs


def pulp_values(xs) -> dict[str, float]:
    return {name: (v.varValue if v.varValue is not None else 0.0) for name, v in xs.items()}
