"""Problem: a backend-neutral mixed-integer linear program, with binary products kept explicit.

Compilers (training.py) write the model once in the order of the maths; every backend reads
the same object. Products of two binaries (a cast is paid only if *both* neighbours take a
given pair of precisions) stay symbolic as `PairTerm`s until `backends/linear.py` turns them into
linear rows, so the choice of formulation is made in one place and the JSON form keeps the
model's meaning, not one solver's encoding of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from qsync_opt.errors import SolverError

VarKind = Literal["binary", "integer", "continuous"]
Sense = Literal["<=", ">=", "=="]
Choice = tuple[str, str, str]
"""(group, op, precision) that a choice variable stands for."""


@dataclass(frozen=True)
class Variable:
    name: str
    kind: VarKind = "binary"
    lb: float = 0.0
    ub: float = 1.0
    """May be math.inf for integer and continuous variables."""


@dataclass(frozen=True)
class PairTerm:
    """y = x_a · x_b for two binaries; expressions refer to it by `name` like any variable.

    The coefficient of the product lives where it is used (a row or the objective), so one
    product can carry a cast time in a time row and nothing elsewhere.
    """

    name: str
    a: str
    b: str


@dataclass(frozen=True)
class OneHot:
    """Exactly one of `variables` is 1: the precision choice of one op in one group."""

    name: str
    variables: tuple[str, ...]


@dataclass(frozen=True)
class Constraint:
    name: str
    coeffs: dict[str, float]
    sense: Sense
    rhs: float


@dataclass
class Problem:
    """min Σ objective·v (+ constant), subject to one-hots and linear rows over variables/pairs.

    `objective_unit` converts the solver's objective into the user's units (the compiler
    rescales by a power of two so that tiny indicators do not fall under solver tolerances;
    a power of two is exact in floating point, so the optimum is unchanged).
    """

    name: str
    variables: dict[str, Variable] = field(default_factory=dict)
    pairs: dict[str, PairTerm] = field(default_factory=dict)
    onehots: list[OneHot] = field(default_factory=list)
    constraints: list[Constraint] = field(default_factory=list)
    objective: dict[str, float] = field(default_factory=dict)
    objective_constant: float = 0.0
    objective_unit: float = 1.0
    choices: dict[str, Choice] = field(default_factory=dict)
    """choice variable -> (group, op, precision): how a solution decodes into an Assignment."""
    fixed: dict[str, dict[str, str]] = field(default_factory=dict)
    """group -> op -> precision for ops with a single allowed precision (folded into constants)."""
    meta: dict[str, Any] = field(default_factory=dict)
    source: Any = field(default=None, compare=False, repr=False)
    """The TrainingInstance this was compiled from, if any (greedy and evaluate need it)."""

    # ---- building -------------------------------------------------------------------------
    def add_var(self, name: str, kind: VarKind = "binary", lb: float = 0.0, ub: float = 1.0) -> str:
        if name in self.variables or name in self.pairs:
            raise SolverError(f"problem {self.name}: variable {name!r} declared twice; names must be unique")
        if kind == "binary":
            lb, ub = max(0.0, lb), min(1.0, ub)
        self.variables[name] = Variable(name, kind, float(lb), float(ub))
        return name

    def add_pair(self, name: str, a: str, b: str) -> str:
        for v in (a, b):
            var = self.variables.get(v)
            if var is None or var.kind != "binary":
                raise SolverError(f"problem {self.name}: pair {name!r} needs binary factors, {v!r} is not one")
        if name in self.variables or name in self.pairs:
            raise SolverError(f"problem {self.name}: pair {name!r} declared twice; names must be unique")
        self.pairs[name] = PairTerm(name, a, b)
        return name

    def add_onehot(self, name: str, variables) -> None:
        self.onehots.append(OneHot(name, tuple(variables)))

    def add_constraint(self, name: str, coeffs: dict[str, float], sense: Sense, rhs: float) -> None:
        if sense not in ("<=", ">=", "=="):
            raise SolverError(f"constraint {name!r}: sense {sense!r} is not one of <=, >=, ==")
        self.constraints.append(Constraint(name, {k: float(c) for k, c in coeffs.items() if c != 0}, sense, float(rhs)))

    # ---- reading --------------------------------------------------------------------------
    def validate(self) -> None:
        """Every name used is declared; raises SolverError naming the first one that is not."""
        known = set(self.variables) | set(self.pairs)
        for oh in self.onehots:
            for v in oh.variables:
                if self.variables.get(v) is None or self.variables[v].kind != "binary":
                    raise SolverError(f"one-hot {oh.name!r}: {v!r} is not a declared binary variable")
        for c in self.constraints:
            for v in c.coeffs:
                if v not in known:
                    raise SolverError(f"constraint {c.name!r}: unknown variable {v!r}")
        for v in self.objective:
            if v not in known:
                raise SolverError(f"objective: unknown variable {v!r}")
        for v in self.choices:
            if v not in self.variables:
                raise SolverError(f"choices: unknown variable {v!r}")

    def complete(self, values: dict[str, float]) -> dict[str, float]:
        """Fill pair products and settle free continuous variables from the binaries in `values`.

        A continuous variable that is minimised (positive objective coefficient) is set to the
        least value its rows allow — for the epigraph T ≥ time_g that is max_g time_g — so the
        objective of a plan can be recomputed from the real coefficients, whatever solver
        (or scaled copy of the model) produced the plan.
        """
        out = dict(values)
        for name, v in self.variables.items():
            if v.kind != "continuous":
                out[name] = float(round(out.get(name, v.lb)))
        for p in self.pairs.values():
            out[p.name] = out[p.a] * out[p.b]
        for name, v in self.variables.items():
            if v.kind == "continuous" and self.objective.get(name, 0.0) > 0:
                out[name] = _least_value(self, name, out)
        return out

    def objective_value(self, values: dict[str, float]) -> float:
        """Objective in the user's units for complete `values`."""
        raw = self.objective_constant + sum(c * values.get(v, 0.0) for v, c in self.objective.items())
        return raw * self.objective_unit

    def violated(self, values: dict[str, float], tol: float = 1e-6) -> list[str]:
        """Rows and one-hots that complete `values` break (relative tolerance on each row)."""
        bad = []
        for oh in self.onehots:
            if abs(sum(values.get(v, 0.0) for v in oh.variables) - 1) > tol:
                bad.append(oh.name)
        for c in self.constraints:
            lhs = sum(a * values.get(v, 0.0) for v, a in c.coeffs.items())
            slack = tol * max(1.0, abs(c.rhs))
            if (c.sense == "<=" and lhs > c.rhs + slack) or (c.sense == ">=" and lhs < c.rhs - slack) or (
                c.sense == "==" and abs(lhs - c.rhs) > slack
            ):
                bad.append(f"{c.name}: {lhs:.6g} {c.sense} {c.rhs:.6g}")
        return bad

    def decode(self, values: dict[str, float]) -> dict[str, dict[str, str]]:
        """Assignment (group -> op -> precision) from solver values of the choice variables."""
        plan: dict[str, dict[str, str]] = {g: dict(ops) for g, ops in self.fixed.items()}
        for var, (g, op, prec) in self.choices.items():
            if values.get(var, 0.0) > 0.5:
                if op in plan.setdefault(g, {}):
                    raise SolverError(f"solution picks two precisions for {g}/{op}: {plan[g][op]} and {prec}")
                plan[g][op] = prec
        return plan

    def encode(self, assignment: dict[str, dict[str, str]]) -> dict[str, float]:
        """Complete variable values for an Assignment (for warm starts and checks)."""
        values = {v: float(assignment.get(g, {}).get(op) == p) for v, (g, op, p) in self.choices.items()}
        return self.complete(values)

    def trivial_bound(self) -> float:
        """A bound no plan beats, in plan units, from the variables' bounds alone: each one-hot
        at its cheapest member, every other term at its cheapest end (products within [0, 1])."""
        in_onehot = {v for oh in self.onehots for v in oh.variables}
        total = self.objective_constant
        for oh in self.onehots:
            total += min((self.objective.get(v, 0.0) for v in oh.variables), default=0.0)
        for v, c in self.objective.items():
            if v in in_onehot:
                continue
            lb, ub = (0.0, 1.0) if v in self.pairs else (self.variables[v].lb, self.variables[v].ub)
            total += c * (lb if c > 0 else ub)
        return total * self.objective_unit if math.isfinite(total) else -math.inf

    def stats(self) -> dict[str, int]:
        return {
            "variables": len(self.variables),
            "binaries": sum(v.kind == "binary" for v in self.variables.values()),
            "pairs": len(self.pairs),
            "onehots": len(self.onehots),
            "constraints": len(self.constraints),
        }


def _least_value(problem: Problem, name: str, values: dict[str, float]) -> float:
    var = problem.variables[name]
    best = var.lb
    for c in problem.constraints:
        coef = c.coeffs.get(name)
        if not coef:
            continue
        rest = sum(a * values.get(v, 0.0) for v, a in c.coeffs.items() if v != name)
        # rest + coef·v (sense) rhs; a lower bound on v arises from <= with coef<0 or >= with coef>0
        if (c.sense == "<=" and coef < 0) or (c.sense == ">=" and coef > 0) or c.sense == "==":
            best = max(best, (c.rhs - rest) / coef)
    return best if math.isfinite(best) else var.lb
