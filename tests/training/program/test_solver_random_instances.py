"""Random instance generators: reproducible, the promised shape, feasible where promised."""

from __future__ import annotations

import pytest

from qsync_opt.errors import SpecError
from qsync_opt.training.program.greedy import greedy
from qsync_opt.training.program.instance import evaluate
from qsync_opt.training.program.random_instances import random_small, synthetic


def test_same_seed_same_instance_other_seed_other_instance():
    assert synthetic(40, 5, 4, "dag", seed=3) == synthetic(40, 5, 4, "dag", seed=3)
    assert synthetic(40, 5, 4, "dag", seed=3) != synthetic(40, 5, 4, "dag", seed=4)
    assert random_small(17) == random_small(17)


@pytest.mark.parametrize("kind", ["chain", "dag"])
def test_synthetic_has_the_requested_shape(kind):
    inst = synthetic(50, 5, 4, kind, seed=0)
    assert len(inst.groups) == 4
    for g in inst.groups:
        assert len(g.allowed) == 50 and all(len(ps) == 5 for ps in g.allowed.values())
        assert g.time_bound_ms is not None
        edges = set(g.cast_ms)
        chain = {(a, b) for a, b in zip(list(g.allowed), list(g.allowed)[1:])}
        assert chain <= edges
        assert (edges == chain) == (kind == "chain")


@pytest.mark.parametrize("kind", ["chain", "dag"])
def test_synthetic_instances_are_feasible_and_their_bounds_bind(kind):
    inst = synthetic(80, 5, 4, kind, seed=1)
    highest = {g.name: {op: ps[0] for op, ps in g.allowed.items()} for g in inst.groups}
    assert not evaluate(inst, highest).feasible  # all-fp32 breaks a time bound: the bound binds
    r = greedy(inst)  # and the fastest plan fits, so greedy always has a start
    assert r.feasible and evaluate(inst, r.assignment).feasible


def test_random_small_stays_small():
    for seed in range(50):
        inst = random_small(seed)
        assert len(inst.groups) == 2
        assert all(len(g.allowed) <= 8 and all(len(ps) <= 3 for ps in g.allowed.values()) for g in inst.groups)


def test_bad_generator_arguments():
    with pytest.raises(SpecError, match="kind: 'tree' is unknown; use 'chain' or 'dag'"):
        synthetic(10, kind="tree")
    with pytest.raises(SpecError, match="n_precisions: 9; use 1..8"):
        synthetic(10, n_precisions=9)
    with pytest.raises(SpecError, match="n_ops=0"):
        synthetic(0)
