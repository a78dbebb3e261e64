"""Budget: one time limit shared by every solver run a call makes.

A user's `time_limit_s` bounds the whole answer: the main solve, the tie-break solve, the
refine rounds and the infeasibility diagnosis draw on the same seconds. Model building is
counted apart (it is reported, not limited: a solver cannot be stopped inside it), so the
wall time of a call is at most the limit plus the build time. Every grant is logged, so a
test can check that no sub-solve was ever given more than what remained.

The entry point (`qsync_opt.solve`, or a caller that plans one spec or instance alone) makes
the one Budget of a call; everything below takes it as an argument and draws on it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

DEFAULT_TIME_LIMIT_S = 60.0
"""`solver.time_limit_s` when a spec (or a bare solve) gives none: the one place it is written."""

MIN_SOLVE_S = 0.01
"""Below this, a sub-solve is not started: it could not finish, and starting it costs more."""

T = TypeVar("T")


class Grant(NamedTuple):
    """One sub-solve's share: what it was given and what remained when it started."""

    label: str
    given_s: float
    left_s: float


@dataclass
class Budget:
    limit_s: float
    spent_s: float = 0.0
    """Solver (search) time charged so far."""
    build_s: float = 0.0
    """Model-building time charged so far (reported, not limited)."""
    grants: list[Grant] = field(default_factory=list)
    """Every sub-solve started, in order."""

    @classmethod
    def unlimited(cls) -> Budget:
        """A budget that never runs out (a plan whose work is not a timed search)."""
        return cls(math.inf)

    def remaining(self) -> float:
        return max(0.0, self.limit_s - self.spent_s) if math.isfinite(self.limit_s) else math.inf

    def grant(self, label: str, want: float = math.inf) -> float | None:
        """Seconds for the next sub-solve (≤ what remains), or None when too little is left."""
        left = self.remaining()
        given = min(want, left)
        if given < MIN_SOLVE_S:
            return None
        self.grants.append(Grant(label, given, left))
        return given

    def charge(self, wall_s: float, build_s: float = 0.0) -> None:
        self.build_s += build_s
        self.spent_s += max(0.0, wall_s - build_s)

    def timed(self, label: str, want: float, fn: Callable[[float], T]) -> T | None:
        """fn(seconds given), charged its whole wall time (building included); None, and fn not
        called, when too little is left."""
        given = self.grant(label, want)
        if given is None:
            return None
        t = time.perf_counter()
        try:
            return fn(given)
        finally:
            self.charge(time.perf_counter() - t)

    @contextmanager
    def part(self, limit_s: float, label: str) -> Iterator[Budget]:
        """A budget of at most `limit_s` of what remains, for one part of the work (one group of a
        decomposed solve); when the part ends, even by an error, its charges and grants (labelled
        `label: ...`) come back to this budget."""
        sub = Budget(min(limit_s, self.remaining()))
        try:
            yield sub
        finally:
            self.charge(sub.spent_s + sub.build_s, sub.build_s)
            self.grants.extend(Grant(f"{label}: {g.label}", g.given_s, g.left_s) for g in sub.grants)

    @property
    def exhausted(self) -> bool:
        return self.remaining() < MIN_SOLVE_S
