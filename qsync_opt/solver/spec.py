"""The `solver:` section every kind's spec shares: which backend, its limits and its seed."""

from __future__ import annotations

import difflib

from pydantic import Field, field_validator

from qsync_opt.solver.budget import DEFAULT_TIME_LIMIT_S
from qsync_opt.spec.base import SpecModel as _Model

#: Solver backends a spec may name: the registry's (qsync_opt.solver.backends.BACKENDS), the
#: uniform-lowest policy, and 'default' (the measured best; see solver.solve.DEFAULT_BACKEND).
BACKEND_NAMES: tuple[str, ...] = ("highs", "cbc", "scip", "cpsat", "greedy", "uniform", "default")



class SolverSpec(_Model):
    backend: str = "default"
    """highs, cbc, scip, cpsat, greedy, uniform, or 'default' (chosen from measurements)."""

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v):
        if v not in BACKEND_NAMES:
            near = difflib.get_close_matches(v, BACKEND_NAMES, n=1, cutoff=0.5)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"unknown backend {v!r}{hint}; known: {', '.join(BACKEND_NAMES)}")
        return v
    time_limit_s: float = Field(default=DEFAULT_TIME_LIMIT_S, gt=0)
    """Seconds for the whole solve: every solver run it makes draws on one Budget (solver/budget.py)."""
    rel_gap: float = Field(default=1e-4, ge=0, lt=1)
    threads: int = Field(default=1, ge=1)
    seed: int = 0
    refine_rounds: int = Field(default=8, ge=0)
    """Replayer-driven re-solves when the linear model misses a bound."""
