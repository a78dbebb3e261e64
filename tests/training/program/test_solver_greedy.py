"""QSync's greedy allocator: its start, its step order, its memory repair, and when it gives up."""

from __future__ import annotations

import pytest

from qsync_opt.training.program.greedy import greedy
from qsync_opt.training.program.instance import GroupInstance, TrainingInstance, evaluate
from qsync_opt.training.program.random_instances import synthetic
from qsync_opt.training.program.solve import solve_instance

P3 = ("fp32", "fp16", "int8")


def _inst(ops: dict[str, dict[str, float]], omega, bound=None, cap=float("inf"), mem=None, casts=None, **kw):
    """One group; `ops` maps op -> precision -> time."""
    g = GroupInstance(
        name="t4",
        share=1.0,
        allowed={op: tuple(t) for op, t in ops.items()},
        time_ms=ops,
        mem_bytes=mem or {op: {p: 1.0 for p in t} for op, t in ops.items()},
        cast_ms=casts or {},
        time_bound_ms=bound,
        mem_capacity_bytes=cap,
    )
    return TrainingInstance(groups=(g,), omega=omega, **kw)


def test_start_is_the_fastest_precision_not_the_lowest():
    # int8 is slower than fp16 here (QSync saw this on T4): only fp16 meets the bound
    inst = _inst({"conv": {"fp32": 10.0, "fp16": 4.0, "int8": 6.0}}, {"conv": {"fp32": 0, "fp16": 1, "int8": 5}}, bound=4.0)
    r = greedy(inst)
    assert r.feasible and r.assignment == {"t4": {"conv": "fp16"}}


def test_raises_the_best_gain_per_added_time_first():
    ops = {"a": {"fp32": 3.0, "int8": 1.0}, "b": {"fp32": 3.0, "int8": 1.0}}
    omega = {"a": {"fp32": 0.0, "int8": 1.0}, "b": {"fp32": 0.0, "int8": 5.0}}
    r = greedy(_inst(ops, omega, bound=4.0))  # room to raise exactly one op: b gains more
    assert r.assignment == {"t4": {"a": "int8", "b": "fp32"}}
    assert r.steps == 1


def test_a_step_that_adds_no_time_is_taken_even_at_a_tight_bound():
    ops = {"a": {"fp32": 1.0, "fp16": 1.0, "int8": 1.0}}  # all equally fast: start picks int8 (lower on ties)
    r = greedy(_inst(ops, {"a": {"fp32": 0.0, "fp16": 1.0, "int8": 2.0}}, bound=1.0))
    assert r.assignment == {"t4": {"a": "fp32"}}


def test_casts_count_in_the_time_of_a_step():
    ops = {"a": {"fp32": 2.0, "int8": 1.0}, "b": {"fp32": 2.0, "int8": 1.0}}
    omega = {"a": {"fp32": 0.0, "int8": 1.0}, "b": {"fp32": 0.0, "int8": 1.0}}
    casts = {("a", "b"): {("fp32", "int8"): 5.0, ("int8", "fp32"): 5.0}}
    inst = _inst(ops, omega, bound=4.5, casts=casts)
    # raising one op alone pays a 5 ms cast and breaks the bound, so greedy (one op per step)
    # stays at int8, although both at fp32 (4 ms, no cast) would fit: the gap the exact program closes
    r = greedy(inst)
    assert evaluate(inst, r.assignment).feasible and r.assignment == {"t4": {"a": "int8", "b": "int8"}}
    assert solve_instance(inst, rel_gap=0.0).assignment == {"t4": {"a": "fp32", "b": "fp32"}}


def test_unbounded_group_starts_high_and_lowers_only_for_memory():
    ops = {"a": {p: 1.0 for p in P3}, "b": {p: 1.0 for p in P3}}
    mem = {"a": {"fp32": 4.0, "fp16": 2.0, "int8": 1.0}, "b": {"fp32": 4.0, "fp16": 2.0, "int8": 1.0}}
    omega = {"a": {"fp32": 0.0, "fp16": 1.0, "int8": 3.0}, "b": {"fp32": 0.0, "fp16": 4.0, "int8": 9.0}}
    assert greedy(_inst(ops, omega, mem=mem)).assignment == {"t4": {"a": "fp32", "b": "fp32"}}
    r = greedy(_inst(ops, omega, mem=mem, cap=5.0))  # must free 3 bytes: lower a (cheap) before b
    assert r.feasible and r.assignment == {"t4": {"a": "int8", "b": "fp32"}}


def test_gives_up_with_a_reason_when_the_start_breaks_the_bound():
    r = greedy(_inst({"a": {"fp32": 3.0, "int8": 2.0}}, {"a": {"fp32": 0.0, "int8": 1.0}}, bound=1.0))
    assert not r.feasible and "t4: fastest start takes 2 ms > bound 1 ms" in r.reason
    r = greedy(_inst({"a": {"fp32": 3.0, "int8": 2.0}}, {"a": {"fp32": 0.0, "int8": 1.0}}, mem={"a": {"fp32": 2.0, "int8": 2.0}}, cap=1.0))
    assert not r.feasible and "memory" in r.reason


def test_iteration_time_greedy_buys_back_accuracy_until_the_budget_holds():
    ops = {"a": {"fp32": 3.0, "int8": 1.0}, "b": {"fp32": 2.0, "int8": 1.0}}
    omega = {"a": {"fp32": 0.0, "int8": 1.0}, "b": {"fp32": 0.0, "int8": 1.0}}
    inst = _inst(ops, omega, objective="iteration_time", max_degradation=1.0)
    r = greedy(inst)
    # one op must go back to fp32; b adds 1 ms for the same gain as a's 2 ms
    assert r.feasible and r.assignment == {"t4": {"a": "int8", "b": "fp32"}}
    assert evaluate(inst, r.assignment).iteration_ms == 3.0


@pytest.mark.parametrize("kind", ["chain", "dag"])
def test_plans_for_synthetic_instances_fit_their_bounds(kind):
    inst = synthetic(300, 5, 4, kind, seed=2)
    r = greedy(inst)
    assert r.feasible
    assert evaluate(inst, r.assignment).feasible
    assert r.steps > 0
