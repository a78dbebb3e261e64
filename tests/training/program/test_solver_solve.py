"""solve_instance / solve_problem results, and the infeasibility diagnosis a user reads."""

from __future__ import annotations

import pytest
from solver_cases import backend_params

from qsync_opt.errors import InfeasibleError, SolverError
from qsync_opt.solver import export
from qsync_opt.solver.backends import SolveOptions
from qsync_opt.training.program.instance import GroupInstance, TrainingInstance, evaluate
from qsync_opt.training.program.random_instances import synthetic
from qsync_opt.training.program.solve import diagnose, solve_instance, solve_problem
from qsync_opt.training.program.compile import compile_training

GIB = 2**30
FP16_INT8 = ("fp16", "int8")


def _one_group(time_ms, mem=None, casts=None, bound=None, cap=float("inf"), fixed_mem=0.0, **kw) -> TrainingInstance:
    ops = list(time_ms)
    g = GroupInstance(
        name="t4",
        share=1.0,
        allowed={op: tuple(time_ms[op]) for op in ops},
        time_ms=time_ms,
        mem_bytes=mem or {op: {p: 0.0 for p in time_ms[op]} for op in ops},
        cast_ms=casts or {},
        time_bound_ms=bound,
        mem_capacity_bytes=cap,
        fixed_mem_bytes=fixed_mem,
    )
    omega = {op: {p: float(i) for i, p in enumerate(time_ms[op])} for op in ops}
    return TrainingInstance(groups=(g,), omega=omega, **kw)


def test_memory_diagnosis_gives_the_least_memory_and_the_shortfall():
    inst = _one_group(
        {"a": {"fp16": 1.0, "int8": 1.0}, "b": {"fp16": 1.0, "int8": 1.0}},
        mem={"a": {"fp16": 16 * GIB, "int8": 8 * GIB}, "b": {"fp16": 16 * GIB, "int8": 8 * GIB}},
        fixed_mem=1.2 * GIB,
        cap=15 * GIB,
    )
    with pytest.raises(InfeasibleError) as e:
        solve_instance(inst)
    assert e.value.diagnosis == ["t4: memory needs ≥ 17.2 GiB at int8 everywhere, capacity 15 GiB (short by 2.2 GiB)"]
    assert "t4: memory needs ≥ 17.2 GiB" in str(e.value)


def test_time_diagnosis_counts_casts_exactly():
    # per-op fastest (a int8, b fp16) sums to 1.0 ms but pays a 2 ms cast; the true least time is 1.5 ms
    casts = {("a", "b"): {("int8", "fp16"): 2.0, ("fp16", "int8"): 2.0}}
    inst = _one_group({"a": {"fp16": 1.0, "int8": 0.5}, "b": {"fp16": 0.5, "int8": 1.0}}, casts=casts, bound=1.2)
    assert diagnose(inst) == [
        "t4: time needs ≥ 1.5 ms even at the fastest plan (casts included), bound 1.2 ms (over by 0.3 ms)",
        "fix: objective.max_iteration_time: 1.5 (ms, on every group) has a plan (checked by an exact solve); it is the least time the slowest group can reach",
    ]


def test_time_and_memory_that_cannot_hold_together_are_named():
    inst = _one_group({"a": {"fp16": 1.0, "int8": 2.0}}, mem={"a": {"fp16": 2.0 * GIB, "int8": 1.0 * GIB}}, bound=1.5, cap=1.5 * GIB)
    lines = diagnose(inst)
    assert lines == ["t4: time and memory cannot both hold: within memory capacity 1.5 GiB the least time is 2 ms, bound 1.5 ms",
                     "fix: objective.max_iteration_time: 2 (ms, on every group) has a plan (checked by an exact solve); it is the least time the slowest group can reach"]


def test_an_impossible_indicator_budget_is_named():
    inst = _one_group({"a": {"fp16": 1.0, "int8": 0.5}}, bound=0.8, objective="iteration_time", max_degradation=0.5)
    with pytest.raises(InfeasibleError) as e:
        solve_instance(inst)
    assert e.value.diagnosis == [
        "indicator budget: the least share-weighted indicator within the time and memory bounds is 1, budget 0.5 (over by 0.5)",
        "fix: objective.max_accuracy_degradation: 1 (an absolute indicator budget) is the least with a plan "
        "(proven optimum of the indicator within the bounds)",
    ]


def test_feasible_instances_get_no_diagnosis():
    assert diagnose(synthetic(20, 3, 2, "dag", seed=0)) == []


@pytest.mark.parametrize("backend", backend_params())
def test_result_is_checked_by_evaluate_and_reports_the_solve(backend):
    inst = synthetic(16, 3, 2, "dag", seed=4)
    r = solve_instance(inst, backend=backend, rel_gap=0.0)
    ev = evaluate(inst, r.assignment)
    assert ev.feasible and r.objective == ev.objective(inst) and r.evaluation == ev
    assert r.backend == backend and r.wall_s > 0
    if backend == "greedy":
        assert r.status == "feasible" and r.bound is None
    else:
        assert r.status == "optimal" and r.bound <= r.objective + 1e-9 and r.warm_start_used
        assert (r.scaling is not None) == (backend == "cpsat")
    assert r.problem_stats["binaries"] == sum(len(ps) for g in inst.groups for ps in g.allowed.values())


def test_warm_start_can_be_turned_off():
    inst = synthetic(16, 3, 2, "chain", seed=4)
    assert not solve_instance(inst, warm_start=False).warm_start_used
    assert solve_instance(inst, warm_start=True).warm_start_used


def test_greedy_giving_up_is_not_called_infeasible():
    # fastest per op (a int8, b fp16) pays a 5 ms cast; fp16 everywhere (2.2 ms) fits the 3 ms bound
    casts = {("a", "b"): {("int8", "fp16"): 5.0}}
    inst = _one_group({"a": {"fp16": 1.2, "int8": 1.0}, "b": {"fp16": 1.0, "int8": 1.1}}, casts=casts, bound=3.0)
    with pytest.raises(SolverError, match="greedy gave up.*fix: use an exact backend such as 'highs'"):
        solve_instance(inst, backend="greedy")
    assert solve_instance(inst).assignment == {"t4": {"a": "fp16", "b": "fp16"}}


def test_a_problem_read_from_json_solves_without_the_model(tmp_path):
    inst = synthetic(12, 3, 2, "dag", seed=9)
    direct = solve_instance(inst, rel_gap=0.0)
    path = str(tmp_path / "p.json")
    export.write_json(compile_training(inst), path, with_instance=False)
    bare = export.read_json(path)
    r = solve_problem(bare, "highs", SolveOptions(rel_gap=0.0))
    assert r.assignment == direct.assignment
    assert r.objective == pytest.approx(direct.objective, rel=1e-12) and r.evaluation is None
    with pytest.raises(SolverError, match="carries no TrainingInstance.*with_instance=True"):
        solve_problem(bare, "greedy")


def test_a_backend_stopped_without_a_plan_falls_back_to_the_checked_warm_start(monkeypatch):
    from qsync_opt.solver.backends import RawResult, highs
    from qsync_opt.training.program.greedy import greedy

    inst = synthetic(30, 4, 2, "dag", seed=2)
    monkeypatch.setattr(highs, "solve", lambda problem, options: RawResult("highs", "unknown", message="Time limit reached"))
    r = solve_instance(inst, backend="highs", time_limit_s=0.1, lagrangian=False)  # the greedy start, not the DP's plan
    assert r.status == "feasible" and r.warm_start_used
    assert r.assignment == greedy(inst).assignment
    assert "nothing better than the greedy warm start" in r.message
    with pytest.raises(SolverError, match="no plan \\(unknown: Time limit reached\\); fix: raise time_limit_s"):
        solve_instance(inst, backend="highs", time_limit_s=0.1, warm_start=False)


def test_a_plan_worse_than_the_warm_start_is_replaced_by_it(monkeypatch):
    from qsync_opt.solver.backends import RawResult, highs
    from qsync_opt.training.program.greedy import greedy

    inst = synthetic(30, 4, 2, "dag", seed=2)
    p = compile_training(inst)
    worst = {g.name: {op: ps[-1] for op, ps in g.allowed.items()} for g in inst.groups}  # lowest everywhere
    values = p.encode(worst)

    def slow(problem, options):
        return RawResult("highs", "feasible", values=values, objective=problem.objective_value(values), gap=0.5)

    monkeypatch.setattr(highs, "solve", slow)
    r = solve_instance(inst, backend="highs", lagrangian=False)  # the greedy start, not the DP's plan
    assert r.status == "feasible" and r.assignment == greedy(inst).assignment
