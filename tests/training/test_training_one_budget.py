"""One Budget per solve: the entry point makes it, every sub-solve draws on it.

The user's `solver.time_limit_s` is a promise about the whole answer: the main solve, the
tie-break, the refine rounds and the infeasibility diagnosis share it. Load-independent: every
backend call reports that it used half the seconds it was granted (a slow solver), and the tests
add up what was granted and used; no wall clock is read.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import qsync_opt
from qsync_opt.errors import InfeasibleError
from qsync_opt.serving.planner import plan_serving
from qsync_opt.solver.backends import BACKENDS
from qsync_opt.solver.budget import DEFAULT_TIME_LIMIT_S, Budget, Grant
from qsync_opt.solver.spec import SolverSpec
from qsync_opt.training import pipeline
from qsync_opt.training.pipeline import plan_job, plan_training, prepare
from qsync_opt.training.spec import load_spec

LIMIT = 20.0
SPEC = {
    "name": "one-budget",
    "cluster": {"groups": [{"name": "v100", "device": "V100-16GB", "count": 4, "role": "training"},
                           {"name": "t4", "device": "T4", "count": 4}], "interconnect": "ethernet-25g"},
    "model": {"name": "resnet18"},
    "training": {"global_batch": 256},
    "solver": {"backend": "highs", "time_limit_s": LIMIT, "refine_rounds": 3},
    "runtime": {"boundary": "edge"},
}
USED = 0.5
"""Share of its grant each (simulated) backend call uses."""


@pytest.fixture(scope="module")
def prepared():
    return prepare(load_spec(SPEC))


@pytest.fixture
def calls(monkeypatch):
    """[(seconds granted, seconds charged)] for every backend call, in order."""
    log = []
    for mod in BACKENDS.values():
        def slow(problem, options, real=mod.solve):
            raw = real(problem, options)
            used = USED * options.time_limit_s
            log.append((options.time_limit_s, max(0.0, used - raw.build_s)))
            return replace(raw, wall_s=max(used, raw.build_s), build_s=raw.build_s)

        monkeypatch.setattr(mod, "solve", slow)
    return log


def _within(calls, budget: Budget):
    spent = 0.0
    for k, (given, used) in enumerate(calls):
        assert given <= LIMIT - spent + 1e-9, f"call {k} granted {given:.3f} s with {LIMIT - spent:.3f} s left: {calls}"
        spent += used
    assert spent <= LIMIT + 1e-9
    for g in budget.grants:
        assert isinstance(g, Grant) and g.given_s <= g.left_s + 1e-12, g
    assert budget.spent_s >= spent - 1e-9  # every simulated second was charged to this one budget


def test_main_solve_and_tie_break_draw_on_the_callers_budget(prepared, calls):
    budget = Budget(LIMIT)
    plan = plan_training(load_spec(SPEC), prepared, budget)
    assert len(calls) >= 2 and len(budget.grants) >= 2  # the main solve and its tie-break both ran ...
    assert "ties broken" in " ".join(plan.solver.notes), plan.solver.notes
    _within(calls, budget)  # ... on the one budget
    assert plan.solver.solve_s == pytest.approx(budget.spent_s)


def test_refine_rounds_draw_on_the_callers_budget(prepared, calls, monkeypatch):
    import qsync_opt.training.refine

    # the program bounds the lockstep iteration exactly; refine rounds need a replayer that disagrees with it
    monkeypatch.setattr(qsync_opt.training.refine, "meets_time_bound", lambda instance, lockstep_ms: False)
    budget = Budget(LIMIT)
    plan = plan_training(load_spec(SPEC), prepared, budget)
    assert plan.solver.refine_rounds >= 1
    _within(calls, budget)


def test_the_diagnosis_of_an_infeasible_spec_draws_on_the_same_budget(prepared, calls):
    budget = Budget(LIMIT)
    spec = load_spec(SPEC, **{"objective.max_iteration_time": 1e-3})
    with pytest.raises(InfeasibleError):
        plan_training(spec, prepared, budget)
    assert any(g.label.startswith("diagnosis") for g in budget.grants), budget.grants
    _within(calls, budget)


def test_qsync_opt_solve_makes_one_budget_of_the_spec_limit_and_passes_it_down(monkeypatch):
    seen = []
    real = pipeline.plan_training

    def spy(spec, prepared, budget=None, **kw):
        seen.append(budget)
        return real(spec, prepared, budget, **kw)

    monkeypatch.setattr(pipeline, "plan_training", spy)
    qsync_opt.solve(SPEC)
    assert len(seen) == 1 and isinstance(seen[0], Budget) and seen[0].limit_s == LIMIT


def test_plan_job_is_the_training_planner_with_its_data_plane(prepared, monkeypatch):
    monkeypatch.setattr(pipeline, "prepare", lambda job: prepared)
    budget = Budget(LIMIT)
    plan = plan_job(load_spec(SPEC), budget)
    assert plan.data_plane is None  # no data.sources
    assert budget.grants and plan.solver.solve_s == pytest.approx(budget.spent_s)


SERVING = {
    "kind": "serving", "name": "tiny",
    "cluster": {"groups": [{"name": "t4", "device": "T4", "count": 2, "memory_gb": 0.1},
                           {"name": "v100", "device": "V100-16GB", "count": 1, "memory_gb": 0.12}]},
    "serving": {"model": {"layers": 6, "hidden": 1024, "ffn": 4096, "heads": 16, "vocab": 32000, "max_positions": 512},
                "prompt_len": 128, "gen_tokens": 16, "global_batch": 8, "bits": [3, 4, 16], "runtime_overhead_gb": 0.0},
    "solver": {"time_limit_s": LIMIT},
}
"""Six small layers on three devices whose memory makes the bits matter (tests/serving's tiny spec)."""


def test_serving_draws_on_the_budget_it_is_given():
    budget = Budget(LIMIT)
    plan = plan_serving(qsync_opt.load_spec(SERVING), budget)
    assert budget.grants and all(g.given_s <= g.left_s + 1e-12 for g in budget.grants)
    assert plan.solver.objective_ms > 0


def test_a_part_gives_back_its_charges_and_grants():
    whole = Budget(10.0)
    with pytest.raises(RuntimeError), whole.part(4.0, "group a") as part:
        assert part.limit_s == 4.0
        assert part.grant("highs solve", 3.0) == 3.0
        part.charge(2.5, build_s=0.5)
        raise RuntimeError  # charged back even when the part fails
    assert whole.spent_s == pytest.approx(2.0) and whole.build_s == pytest.approx(0.5)
    assert whole.grants == [Grant("group a: highs solve", 3.0, 4.0)]
    with whole.part(100.0, "group b") as part:
        assert part.limit_s == pytest.approx(8.0)  # never more than what remains


def test_timed_runs_only_with_time_left_and_charges_the_whole_call():
    b = Budget(1.0)
    assert b.timed("x", 0.5, lambda given: given) == 0.5
    b.charge(1.0)
    assert b.exhausted and b.timed("y", 0.5, lambda given: pytest.fail("ran without time")) is None
    assert Budget.unlimited().remaining() == float("inf")


def test_the_default_time_limit_is_written_once():
    from qsync_opt.solver.backends.base import SolveOptions

    assert SolverSpec().time_limit_s == SolveOptions().time_limit_s == DEFAULT_TIME_LIMIT_S
