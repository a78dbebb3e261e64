"""Shared helpers for the solver tests: backend parametrisation (skip what is not installed)."""

from __future__ import annotations

import pytest

from qsync_opt.solver.backends import BACKENDS, EXACT, available

AVAILABLE = available()
N_SMALL = 240
"""Random small instances every exact backend is checked on (≥ 200 asked)."""


def backend_params(names=None):
    """pytest params over backends, skipped (not failed) where the solver is not installed."""
    names = list(names or BACKENDS)
    return [pytest.param(n, id=n, marks=pytest.mark.skipif(not AVAILABLE[n], reason=f"{n} not available")) for n in names]


def exact_params():
    return backend_params(EXACT)


def rel_close(a: float, b: float, rel: float = 1e-6, abs_: float = 1e-9) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b)) + abs_
