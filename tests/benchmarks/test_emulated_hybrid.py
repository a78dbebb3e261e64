"""emulated_hybrid's planning half: its spec, and one trainable Plan per policy (no profiling, no training)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from emulated_hybrid import ENV, POLICIES, make_spec, policy_plans, second_device  # noqa: E402

from qsync_opt.training.spec import load_spec  # noqa: E402


@pytest.fixture(scope="module")
def planned():
    device, _ = second_device()
    raw = make_spec("tiny-cnn", 64, 5, device, ["fp32", "int8"])
    raw["costs"] = "roofline"  # the benchmark measures; the test only needs a plan with baselines
    from qsync_opt.training.pipeline import solve

    spec = load_spec(raw)
    return spec, solve(spec)


def test_the_second_group_is_the_capped_cpu_with_its_env(planned):
    spec, _ = planned
    native, capped = spec.cluster.groups
    assert native.env == {} and capped.env == ENV == {"ONEDNN_MAX_CPU_ISA": "SSE41"}
    assert capped.device_spec.name in ("cpu-sse41", "cpu-local")
    assert [native.local_batch, capped.local_batch] == [32, 32]
    assert set(capped.allowed_precisions) <= {"fp32", "int8"}


def test_every_policy_gets_a_plan_with_its_own_maps_and_identical_ones_point_to_the_first(planned):
    _, plan = planned
    pols = policy_plans(plan)
    assert "ilp" in pols and set(pols) <= set(POLICIES)
    for pol, (p, same) in pols.items():
        label = POLICIES[pol]
        want = {n: dict(g.precisions) for n, g in plan.groups.items()} if label is None else plan.baselines[label].precisions
        assert {n: dict(g.precisions) for n, g in p.groups.items()} == want
        assert {n: g.local_batch for n, g in p.groups.items()} == {n: g.local_batch for n, g in plan.groups.items()}
        if same:
            first = pols[same][0]
            assert json.dumps({n: g.precisions for n, g in first.groups.items()}, sort_keys=True) == \
                json.dumps({n: g.precisions for n, g in p.groups.items()}, sort_keys=True)
            assert not pols[same][1]  # it points at the first of its kind, itself unshared
    fp32 = pols["fp32"][0]
    assert all(set(g.precisions.values()) == {"fp32"} for g in fp32.groups.values())
    low = pols["uniform-lowest"][0]
    assert all(set(g.precisions.values()) == {"int8"} for g in low.groups.values())
