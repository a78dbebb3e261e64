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
