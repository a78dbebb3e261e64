"""Solver backends: one module each, a registry over them (PuLP's `pulp/apis/` shape).

Every backend module has `name`, `available() -> bool` and
`solve(problem, options) -> RawResult`. A missing optional solver makes `available()`
false instead of breaking import.
"""

from __future__ import annotations

from types import ModuleType

from qsync_opt.errors import SolverError
from qsync_opt.solver.backends import cbc, cpsat, greedy_backend, highs, scip
from qsync_opt.solver.backends.base import Backend, RawResult, SolveOptions, Status

BACKENDS: dict[str, ModuleType] = {m.name: m for m in (highs, cbc, scip, cpsat, greedy_backend)}
#: Backends that prove optimality (greedy is a heuristic).
EXACT: tuple[str, ...] = ("highs", "cbc", "scip", "cpsat")


def available() -> dict[str, bool]:
    """name -> whether that backend can run here."""
    return {n: bool(m.available()) for n, m in BACKENDS.items()}


def get_backend(name: str) -> ModuleType:
    """The backend called `name`; SolverError listing the known ones (and which run here) if unknown."""
    try:
        return BACKENDS[name]
    except KeyError:
        status = ", ".join(f"{n} ({'available' if ok else 'not available'})" for n, ok in available().items())
        raise SolverError(f"backend: unknown name {name!r}; known: {status}") from None


__all__ = ["BACKENDS", "EXACT", "Backend", "RawResult", "SolveOptions", "Status", "available", "get_backend"]
