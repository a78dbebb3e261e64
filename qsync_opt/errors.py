"""One small hierarchy of errors, each carrying the context a user needs to fix the input.

The CLI maps SpecError to exit code 2 and InfeasibleError to exit code 3, and prints the
message without a traceback.
"""

from __future__ import annotations


class QSyncError(Exception):
    """Base class for every error qsync-opt raises on purpose."""


class SpecError(QSyncError, ValueError):
    """The job spec (or another user input) is invalid. The message names field, value and fix."""


class ModelError(QSyncError):
    """A model could not be built or traced."""


class SolverError(QSyncError):
    """A backend failed (not the same as the problem being infeasible)."""


class InfeasibleError(QSyncError):
    """No plan satisfies the bounds; `diagnosis` says which group, which bound and by how much."""

    def __init__(self, message: str, diagnosis: list[str] | None = None):
        super().__init__(message)
        # a list subclass (solver.diagnose.Diagnosis) keeps what it carries beyond the lines
        self.diagnosis = diagnosis if isinstance(diagnosis, list) else list(diagnosis or [])

    def __str__(self) -> str:
        lines = [super().__str__(), *("  - " + d for d in self.diagnosis)]
        return "\n".join(lines)


class KernelBuildError(QSyncError):
    """A rendered kernel failed to compile; the message holds the compiler output."""


class RuntimeSetupError(QSyncError):
    """A plan could not be applied to a module (unknown FQN, unsupported op, bad group)."""
