"""An infeasible spec gets the fixes the diagnosis can prove, and batch_split: auto names the
closest split it saw. Before, the user read "t4 over by 0.04 ms" and was left to guess."""

import re

import pytest

from qsync_opt.errors import InfeasibleError
from qsync_opt.training.pipeline import plan_training, prepare
from qsync_opt.training.spec import load_spec

SPEC = {
    "name": "fix",
    "cluster": {"groups": [{"name": "v100", "device": "V100-32GB", "role": "training"}, {"name": "t4", "device": "T4"}],
                "interconnect": "ethernet-100g"},
    "model": {"name": "tiny-cnn"},
    "training": {"global_batch": 256},
    "solver": {"backend": "highs", "time_limit_s": 60},
    "runtime": {"boundary": "fp32"},
}


@pytest.fixture(scope="module")
def prepared():
    return prepare(load_spec(SPEC))


def _infeasible(prepared, **overrides) -> InfeasibleError:
    with pytest.raises(InfeasibleError) as e:
        plan_training(load_spec(SPEC, **overrides), prepared)
    return e.value


def _proposed_bound(text: str) -> float:
    m = re.search(r"fix: objective\.max_iteration_time: ([0-9.e-]+) \(ms", text)
    assert m, text
    return float(m.group(1))


def test_a_bound_too_tight_gets_the_least_bound_with_a_plan(prepared):
    err = _infeasible(prepared, **{"objective.max_iteration_time": 0.05})
    text = str(err)
    assert "v100: time needs" in text and "t4: time needs" in text  # every group, not the first that failed
    bound = _proposed_bound(text)
    plan = plan_training(load_spec(SPEC, **{"objective.max_iteration_time": bound}), prepared)  # the fix works
    assert plan.groups["t4"].iteration_ms <= bound * (1 + 1e-6)
    _infeasible(prepared, **{"objective.max_iteration_time": bound - 0.002})  # and is the least, to the µs


def test_the_auto_bound_gets_a_numeric_bound_that_works(prepared):
    bound = _proposed_bound(str(_infeasible(prepared)))  # auto: t4 cannot keep pace with the V100 at 128 each
    plan_training(load_spec(SPEC, **{"objective.max_iteration_time": bound}), prepared)


def test_batch_split_auto_names_the_best_split_it_saw_and_a_bound_that_works_there(prepared):
    tight = {"training.batch_split": "auto", "objective.max_iteration_time": 0.1}
    text = str(_infeasible(prepared, **tight))
    m = re.search(r"best split seen: \{'v100': (\d+), 't4': (\d+)\}, where the slowest group's least time is ([0-9.]+)x", text)
    assert m, text
    assert int(m.group(1)) + int(m.group(2)) == 256 and float(m.group(3)) > 1
    bound = _proposed_bound(text)
    plan = plan_training(load_spec(SPEC, **{**tight, "objective.max_iteration_time": bound}), prepared)
    assert plan.iteration_ms > 0


def _resnet18(t4_precisions=None):
    """QSync's case (tests/training/test_pipeline.py): resnet18 on 2 V100 + 2 T4 at the edge boundary, where the
    T4s keep pace only with lowered operators."""
    t4 = {"name": "t4", "device": "T4", "count": 2, **({"precisions": t4_precisions} if t4_precisions else {})}
    return load_spec({**SPEC, "model": {"name": "resnet18"}, "runtime": {"boundary": "edge"},
                      "cluster": {"groups": [{"name": "v100", "device": "V100-16GB", "count": 2, "role": "training"}, t4],
                                  "interconnect": "ethernet-100g"}})


def test_a_format_the_spec_left_out_is_proposed_when_it_gives_a_plan():
    spec = _resnet18(["fp32"])
    prepared = prepare(spec)
    with pytest.raises(InfeasibleError) as e:
        plan_training(spec, prepared)
    fix = next(x for x in e.value.diagnosis if "precisions (t4): add" in x)
    added = fix.split("add ")[1].split(" (checked")[0].split(", ")
    assert len(added) == 1  # one format suffices, so one is proposed
    plan = plan_training(_resnet18(["fp32", *added]), prepared)  # and it really has a plan
    assert set(plan.groups["t4"].precisions.values()) <= {"fp32", *added}
