"""The "marginal" product formulation is exact too, on every exact backend."""

from __future__ import annotations

import pytest
from solver_cases import check_against_brute_force, exact_params

MARGINAL_STRIDE = 3
"""Every third case (80): includes random_small(99), where CBC's preprocessing went wrong, and
seed 150, where CP-SAT at 2**30 scaling did."""


@pytest.mark.parametrize("backend", exact_params())
def test_marginal_formulation_equals_brute_force(backend, small_cases):
    problems = check_against_brute_force(backend, small_cases[::MARGINAL_STRIDE], formulation="marginal")
    assert not problems, "\n".join(problems[:20])
