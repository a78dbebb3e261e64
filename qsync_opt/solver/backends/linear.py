"""Exact linearisation of a Problem's binary products, shared by every backend.

Two exact formulations of y = x_a·x_b (x binary):

* "mccormick": y ∈ [0, 1], y ≥ x_a + x_b − 1, and — only where the product can profit from
  being large — y ≤ x_a, y ≤ x_b. It is exact with the lower row alone when y appears only
  on the "less is better" side (coefficient ≥ 0 in a ≤ row or in the minimised objective,
  ≤ 0 in a ≥ row): any feasible point with y above x_a·x_b stays feasible and no better
  when y is lowered to x_a·x_b, and y cannot go below it. Cast costs are non-negative in
  practice, so the compiler's rows need one inequality per non-zero cast pair.
* "marginal": for two one-hot groups A and B, y[u, v] ≥ 0 for every u ∈ A, v ∈ B with
  Σ_v y[u, v] = x_u and Σ_u y[u, v] = x_v. With one-hot x these force y[u, v] = x_u·x_v
  exactly (whatever the signs), and the LP relaxation is the local marginal polytope,
  much tighter than McCormick: |A|·|B| variables and |A| + |B| rows per edge.

Repeated products share one variable; the optimum is that of the unshared model because
every copy would be forced to the same value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from qsync_opt.errors import SolverError
from qsync_opt.solver.problem import Constraint, OneHot, Problem, Variable

Method = Literal["mccormick", "marginal"]
METHODS = ("mccormick", "marginal")
CONST_TOL = 1e-9
"""A variable-free row fails only by more than this: a bound equal to a pinned group's own time
differs from the row's sum by rounding (0 <= -2.2e-16), which no solver and no evaluate() rejects."""


@dataclass
class LinearModel:
    """A Problem with products replaced by continuous variables and linear rows."""

    problem: Problem
    variables: dict[str, Variable]
    onehots: list[OneHot]
    constraints: list[Constraint]
    objective: dict[str, float]
    objective_constant: float
    products: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Linearised product variable -> its two binary factors (integral whenever they are)."""
    violated_constants: list[str] = field(default_factory=list)
    """Rows with no variables left whose constant already breaks them: the model is infeasible."""

    def hint(self, problem_values: dict[str, float]) -> dict[str, float]:
        """Values for every variable here, from complete values of the source Problem."""
        out = {v: problem_values.get(v, 0.0) for v in self.variables}
        for y, (a, b) in self.products.items():
            out[y] = problem_values.get(a, 0.0) * problem_values.get(b, 0.0)
        return out


def linearize(problem: Problem, method: Method = "mccormick") -> LinearModel:
    if method not in METHODS:
        raise SolverError(f"linearize: method {method!r} unknown; use one of {', '.join(METHODS)}")
    problem.validate()
    model = LinearModel(
        problem=problem,
        variables=dict(problem.variables),
        onehots=list(problem.onehots),
        constraints=[],
        objective=dict(problem.objective),
        objective_constant=problem.objective_constant,
    )
    rename: dict[str, str] = {}  # pair name -> linear variable carrying it
    extra: list[Constraint] = []
    onehot_of = {v: oh for oh in problem.onehots for v in oh.variables}
    upward = _pairs_that_want_to_grow(problem)
    marginal_done: set[tuple[str, str]] = set()
    for p in problem.pairs.values():
        ga, gb = onehot_of.get(p.a), onehot_of.get(p.b)
        if ga is not None and ga is gb:
            # same one-hot: x_a·x_b is x_a when a == b, else 0
            model.variables[p.name] = Variable(p.name, "continuous", 0.0, 1.0 if p.a == p.b else 0.0)
            if p.a == p.b:
                extra.append(Constraint(f"{p.name}_eq", {p.name: 1.0, p.a: -1.0}, "==", 0.0))
            rename[p.name] = p.name
            model.products[p.name] = (p.a, p.b)
        elif method == "marginal" and ga is not None and gb is not None:
            (g1, u), (g2, v) = sorted([(ga, p.a), (gb, p.b)], key=lambda t: t[0].name)
            if (g1.name, g2.name) not in marginal_done:
                marginal_done.add((g1.name, g2.name))
                _add_marginal(model, extra, g1, g2)
            rename[p.name] = f"m_{u}__{v}"
        else:
            model.variables[p.name] = Variable(p.name, "continuous", 0.0, 1.0)
            model.products[p.name] = (p.a, p.b)
            rename[p.name] = p.name
            extra.append(Constraint(f"{p.name}_lo", {p.name: 1.0, p.a: -1.0, p.b: -1.0}, ">=", -1.0))
            if p.name in upward:
                extra.append(Constraint(f"{p.name}_ua", {p.name: 1.0, p.a: -1.0}, "<=", 0.0))
                extra.append(Constraint(f"{p.name}_ub", {p.name: 1.0, p.b: -1.0}, "<=", 0.0))
    for c in problem.constraints:
        coeffs = _sub(c.coeffs, rename)
        if coeffs:
            model.constraints.append(Constraint(c.name, coeffs, c.sense, c.rhs))
        elif (c.sense == "<=" and c.rhs < -CONST_TOL) or (c.sense == ">=" and c.rhs > CONST_TOL) or (
                c.sense == "==" and abs(c.rhs) > CONST_TOL):
            model.violated_constants.append(f"{c.name}: 0 {c.sense} {c.rhs:.6g}")
    model.constraints.extend(extra)
    model.objective = _sub(problem.objective, rename)
    return model


def _add_marginal(model: LinearModel, rows: list[Constraint], ga: OneHot, gb: OneHot) -> None:
    for u in ga.variables:
        for v in gb.variables:
            name = f"m_{u}__{v}"
            if name in model.variables:
                raise SolverError(f"linearize: product name {name!r} collides with a declared variable")
            model.variables[name] = Variable(name, "continuous", 0.0, 1.0)
            model.products[name] = (u, v)
    for u in ga.variables:
        coeffs = {f"m_{u}__{v}": 1.0 for v in gb.variables}
        coeffs[u] = -1.0
        rows.append(Constraint(f"mg_{u}__{gb.name}", coeffs, "==", 0.0))
    for v in gb.variables:
        coeffs = {f"m_{u}__{v}": 1.0 for u in ga.variables}
        coeffs[v] = -1.0
        rows.append(Constraint(f"mg_{ga.name}__{v}", coeffs, "==", 0.0))


def _sub(coeffs: dict[str, float], rename: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for v, c in coeffs.items():
        k = rename.get(v, v)
        out[k] = out.get(k, 0.0) + c
    return {k: c for k, c in out.items() if c != 0}


def _pairs_that_want_to_grow(problem: Problem) -> set[str]:
    """Pairs whose value could profit from exceeding x_a·x_b (need the upper McCormick rows)."""
    grow = {v for v, c in problem.objective.items() if v in problem.pairs and c < 0}
    for c in problem.constraints:
        for v, a in c.coeffs.items():
            if v in problem.pairs and (c.sense == "==" or (c.sense == "<=") == (a < 0)):
                grow.add(v)
    return grow
