"""Budget: one time limit shared by every solver run a call makes.

A user's `time_limit_s` bounds the whole answer: the main solve, the tie-break solve, the
refine rounds and the infeasibility diagnosis draw on the same seconds. Model building is
counted apart (it is reported, not limited: a solver cannot be stopped inside it), so the
wall time of a call is at most the limit plus the build time. Every grant is logged, so a
test can check that no sub-solve was ever given more than what remained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MIN_SOLVE_S = 0.01
"""Below this, a sub-solve is not started: it could not finish, and starting it costs more."""


@dataclass
class Budget:
    limit_s: float
    spent_s: float = 0.0
    """Solver (search) time charged so far."""
    build_s: float = 0.0
    """Model-building time charged so far (reported, not limited)."""
    grants: list[tuple[str, float, float]] = field(default_factory=list)
    """(label, seconds given, seconds that remained) for every sub-solve started."""

    def remaining(self) -> float:
        return max(0.0, self.limit_s - self.spent_s) if math.isfinite(self.limit_s) else math.inf

    def grant(self, label: str, want: float = math.inf) -> float | None:
        """Seconds for the next sub-solve (≤ what remains), or None when too little is left."""
        left = self.remaining()
        given = min(want, left)
        if given < MIN_SOLVE_S:
            return None
        self.grants.append((label, given, left))
        return given

    def charge(self, wall_s: float, build_s: float = 0.0) -> None:
        self.build_s += build_s
        self.spent_s += max(0.0, wall_s - build_s)

    @property
    def exhausted(self) -> bool:
        return self.remaining() < MIN_SOLVE_S
