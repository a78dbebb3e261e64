"""Session fixtures: the random small instances and their brute-force optima, built once."""

from __future__ import annotations

import pytest
from solver_cases import N_SMALL

from qsync_opt.training.program.brute import brute_force
from qsync_opt.training.program.random_instances import random_small


@pytest.fixture(scope="session")
def small_cases():
    """[(seed, instance, BruteResult)] for seeds 0..N_SMALL-1: both objectives, bounds that bind or fail."""
    out = []
    for seed in range(N_SMALL):
        inst = random_small(seed)
        out.append((seed, inst, brute_force(inst)))
    return out
