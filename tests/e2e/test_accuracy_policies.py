"""The accuracy harness's policies, as planned for a hybrid cluster (planning only; training is the benchmark's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def policies():
    sys.path.insert(0, str(BENCH))
    from accuracy import CLUSTERS, PLAN_BATCH, TASKS
    from accuracy_policies import plan_policies

    strong, split = CLUSTERS["v100-t4"]
    return plan_policies(TASKS["cnn"][0], strong, split, None, PLAN_BATCH)


def test_every_policy_is_planned_with_a_precision_map_and_figures(policies):
    from accuracy_policies import POLICIES

    assert set(policies) == set(POLICIES)
    for p in policies.values():
        assert p.precisions is not None, p
        assert set(p.precisions) == {"strong", "t4"} and p.predicted_ms > 0 and p.indicator >= 0
        assert sum(p.local_batches.values()) == 4096


def test_policies_mean_what_their_names_say(policies):
    t4 = {n: set(p.precisions["t4"].values()) for n, p in policies.items()}
    assert t4["fp32"] == t4["batching"] == {"fp32"}
    assert t4["uniform-lowest"] == {"int4"}
    assert t4["qsync-greedy"] <= {"fp16", "fp32"}  # QSync never goes below its FP16 start
    assert policies["batching"].local_batches["strong"] > policies["batching"].local_batches["t4"]
    # the exact plan is never worse on the indicator than either greedy (same bound, same scale)
    for g in ("qsync-greedy", "greedy"):
        assert policies["ilp"].indicator <= policies[g].indicator * (1 + 1e-9) + 1e-15


def test_training_batches_keep_the_plans_split():
    sys.path.insert(0, str(BENCH))
    from accuracy import train_batches

    assert train_batches({"strong": 2560, "t4": 1536}, 64) == {"strong": 40, "t4": 24}
    assert train_batches({"strong": 4095, "t4": 1}, 64) == {"strong": 63, "t4": 1}


@pytest.fixture(scope="module")
def intonly():
    """V100 + a T4 offering int8 and int4 only, at the split the harness's pace rule picks."""
    sys.path.insert(0, str(BENCH))
    from accuracy import CLUSTERS, PLAN_BATCH, TASKS
    from accuracy_policies import pace_split, plan_policies

    strong = CLUSTERS["v100-t4"][0]
    split = pace_split(TASKS["cnn"][0], strong, ("int8", "int4"), PLAN_BATCH)
    return split, plan_policies(TASKS["cnn"][0], strong, split, ("int8", "int4"), PLAN_BATCH)


def _group_times(split, weak, kind):
    from accuracy import PLAN_BATCH, TASKS
    from accuracy_policies import cluster_spec

    from qsync_opt.training.pipeline import prepare
    from qsync_opt.training.predictor.instance_builder import baseline, build_instance
    from qsync_opt.training.predictor.replayer import replay
    from qsync_opt.training.spec import load_spec

    spec = load_spec(cluster_spec(TASKS["cnn"][0], "V100-32GB", (2048, 2048), weak, global_batch=PLAN_BATCH))
    prep = prepare(spec)
    inst, ctx = build_instance(spec, prep.graph, prep.sensitivity, local_batches={"strong": split[0], "t4": split[1]},
                               boundary=spec.runtime.boundary)
    tl = replay(ctx, baseline(inst, kind))
    return tl.groups["strong"].iteration_ms, tl.groups["t4"].iteration_ms


def test_pace_split_is_the_largest_weak_batch_that_keeps_pace_at_the_lowest_precision(intonly):
    split, _ = intonly
    q = sum(split) // 16
    assert sum(split) == 4096 and split[1] % q == 0
    strong, weak = _group_times(split, ("int8", "int4"), "lowest")
    assert weak <= strong
    strong, weak = _group_times((split[0] - q, split[1] + q), ("int8", "int4"), "lowest")
    assert weak > strong


def test_int_only_weak_group_plans_choose_among_low_precisions_with_an_fp32_ceiling(intonly):
    _, pols = intonly
    t4 = {n: set(p.precisions["t4"].values()) for n, p in pols.items()}
    assert t4["fp32"] == {"fp32"} and set(pols["fp32"].precisions["strong"].values()) == {"fp32"}
    assert pols["fp32"].predicted_ms is None and "ceiling" in pols["fp32"].note
    assert t4["uniform-lowest"] == {"int4"}
    for n in ("ilp", "greedy", "qsync-greedy", "joint", "batching"):
        assert t4[n] <= {"int8", "int4"}, n
    # uniform int4 keeps pace at this split, so the ILP's bound cannot be looser than its time allows
    assert pols["ilp"].predicted_ms <= pols["uniform-lowest"].predicted_ms * (1 + 1e-6)
    for g in ("qsync-greedy", "greedy"):
        assert pols["ilp"].indicator <= pols[g].indicator * (1 + 1e-9) + 1e-15
    assert pols["ilp"].indicator <= pols["uniform-lowest"].indicator


def test_a_5pct_bound_setting_bounds_every_planner_at_5pct_above_uniform_lowest(intonly):
    """'intonly-5pct': the pace split, every planner under max_iteration_time = 1.05 × uniform-lowest's lockstep
    iteration; the ILP may use that room (never beyond it) and is never worse on the indicator than with QSync's
    'auto' bound (its feasible set only grows)."""
    from accuracy import BOUND_SLACK, CLUSTERS, PLAN_BATCH, SETTINGS, TASKS
    from accuracy_policies import lowest_iteration, plan_policies

    split, auto = intonly
    weak, rule = SETTINGS["intonly-5pct"]
    assert rule == "pace" and BOUND_SLACK["intonly-5pct"] == 0.05
    strong = CLUSTERS["v100-t4"][0]
    low = lowest_iteration(TASKS["cnn"][0], strong, split, weak, PLAN_BATCH)
    assert low == pytest.approx(auto["uniform-lowest"].predicted_ms, rel=1e-9)
    pols = plan_policies(TASKS["cnn"][0], strong, split, weak, PLAN_BATCH, bound=1.05 * low)
    for n in ("ilp", "greedy", "joint"):
        assert pols[n].predicted_ms <= 1.05 * low * (1 + 1e-6), n
    assert set(pols["uniform-lowest"].precisions["t4"].values()) == {"int4"}
    assert set(pols["ilp"].precisions["strong"].values()) == {"fp32"}  # the strong group stays fp32 (role training)
    assert pols["ilp"].indicator <= auto["ilp"].indicator * (1 + 1e-9)
    assert pols["ilp"].indicator <= pols["greedy"].indicator * (1 + 1e-9) + 1e-15
