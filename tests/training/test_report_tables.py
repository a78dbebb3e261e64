"""Plan tables say which indicator scale each column is on, and solver internals stay under --verbose."""

import pytest

from qsync_opt.console import make_console
from qsync_opt.training.plan import Baseline, GroupPlan, Plan, Provenance, SolverReport
from qsync_opt.training.report import print_plan, user_notes

INTERNAL = "highs: Optimal; tie-break skipped: backend returned a plan that breaks the instance"
USER = "costs of t4: roofline (no profile; run `qsync-opt profile SPEC`)"


@pytest.fixture
def tiny_plan() -> Plan:
    groups = {n: GroupPlan(device=d, count=1, local_batch=8, precisions={"fc": p}, compute_ms=1.0, comm_exposed_ms=0.0,
                           iteration_ms=1.0, peak_memory_bytes=1.0, memory_capacity_bytes=1e9, indicator=0.002)
              for n, d, p in (("a100", "A100-40GB", "fp32"), ("t4", "T4", "int8"))}
    lowest = Baseline(iteration_ms=0.5, indicator=0.004, peak_memory_bytes={"a100": 1.0, "t4": 1.0}, feasible=True)
    return Plan(job="j", model="m", objective="accuracy_degradation", groups=groups, iteration_ms=1.0, indicator=0.001,
                baselines={"uniform lowest": lowest},
                solver=SolverReport(backend="highs", status="optimal", objective=0.001, wall_s=0.1),
                provenance=Provenance(spec_digest="test", versions={}))


def test_indicator_columns_are_labelled_with_their_scale(capsys, tiny_plan):
    print_plan(tiny_plan, make_console())
    out = capsys.readouterr().out
    assert "Σω (group)" in out and "Σ share·ω" in out and "weighted by batch share" in out and "(unweighted)" in out
    assert "┃ indicator" not in out  # no column on an unnamed scale


def test_internal_notes_only_under_verbose(capsys, tiny_plan):
    plan = tiny_plan.model_copy(update={"solver": tiny_plan.solver.model_copy(update={"notes": [USER, INTERNAL]})})
    print_plan(plan, make_console())
    out = capsys.readouterr().out
    assert USER in out and "tie-break skipped" not in out and "--verbose" in out
    print_plan(plan, make_console(), verbose=True)
    assert "tie-break skipped" in capsys.readouterr().out
    assert user_notes([USER, INTERNAL]) == ([USER], [INTERNAL])
