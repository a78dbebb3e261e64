"""The replayer agrees with the linear instance, and adds what the instance cannot know."""

from __future__ import annotations

import pytest

from predictor_graphs import conv_chain_graph, deep_mlp_graph, flat_omega, residual_graph
from qsync_opt.errors import SpecError
from qsync_opt.training.predictor.instance_builder import baseline, build_instance
from qsync_opt.training.predictor.replayer import replay, verify
from qsync_opt.training.program.instance import evaluate
from qsync_opt.training.spec import load_spec

ONE_GROUP = """
cluster:
  groups: [{name: a100, device: A100-40GB}]
model: {name: resnet18}
training: {global_batch: 32, optimizer: adam}
objective: {max_iteration_time: 100.0}
"""
TWO_GROUPS = """
cluster:
  groups:
    - {name: a100, device: A100-40GB, count: 2}
    - {name: t4, device: T4, count: 2}
  interconnect: pcie3
model: {name: resnet18}
training: {global_batch: 64, optimizer: adam}
objective: {max_iteration_time: 1000.0}
"""


def _mixed(instance):
    """Alternate highest and lowest along each group's ops: casts on every selectable edge."""
    return {g.name: {op: ps[i % 2 - 1] if len(ps) > 1 else ps[0] for i, (op, ps) in enumerate(g.allowed.items())}
            for g in instance.groups}


@pytest.mark.parametrize("boundary", ["edge", "fp32"])
def test_single_rank_replay_equals_the_instance(boundary):
    graph = residual_graph()
    inst, ctx = build_instance(load_spec(ONE_GROUP), graph, flat_omega(graph), boundary=boundary)
    for assignment in (baseline(inst, "highest"), baseline(inst, "lowest"), _mixed(inst)):
        tl = replay(ctx, assignment)
        ev = evaluate(inst, assignment)
        assert tl.groups["a100"].comm_exposed_ms == 0.0
        assert tl.groups["a100"].iteration_ms == pytest.approx(ev.time_ms["a100"], rel=1e-9)
        assert tl.groups["a100"].peak_memory_bytes == pytest.approx(ev.mem_bytes["a100"], rel=1e-9)
    mixed = replay(ctx, _mixed(inst)).groups["a100"]
    assert (mixed.cast_ms > 0) == (boundary == "edge")
    assert replay(ctx, baseline(inst, "lowest")).groups["a100"].cast_ms == 0.0


def test_the_instance_prices_the_exposed_allreduce_the_replayer_finds():
    graph = deep_mlp_graph()
    inst, ctx = build_instance(load_spec(TWO_GROUPS), graph, flat_omega(graph))
    hi = baseline(inst, "highest")
    tl, ev = replay(ctx, hi), evaluate(inst, hi)
    assert ev.iteration_ms == pytest.approx(tl.iteration_ms, rel=1e-9)  # the lockstep rows (lockstep.py)
    assert all(tl.groups[g].comm_ms > 0 for g in ("a100", "t4"))
    lo = baseline(inst, "lowest")
    tl_lo, ev_lo = replay(ctx, lo), evaluate(inst, lo)
    for g in ("a100", "t4"):
        t = tl_lo.groups[g]
        assert t.compute_ms == pytest.approx(t.forward_ms + t.backward_ms + t.optimizer_ms)
        assert t.iteration_ms == pytest.approx(t.compute_ms + t.comm_exposed_ms)
        # a shorter backward hides less of the same all-reduce ...
        assert t.comm_exposed_ms > tl.groups[g].comm_exposed_ms
    # ... and the instance, whose rows carry every bucket's all-reduce, prices exactly that
    assert ev_lo.iteration_ms == pytest.approx(tl_lo.iteration_ms, rel=1e-9)
    # verify's promise: per group, compute + exposed all-reduce (assembled here from its parts,
    # not read from the one field verify returns)
    v = verify(ctx, lo)
    assert set(v) == {g.name for g in inst.groups}
    for g in ("a100", "t4"):
        t = tl_lo.groups[g]
        assert v[g] == pytest.approx(t.forward_ms + t.backward_ms + t.optimizer_ms + t.comm_exposed_ms, rel=1e-12)


def test_lockstep_iteration_waits_for_the_slowest_group():
    graph = conv_chain_graph(batch=32, c=64, hw=32)
    inst, ctx = build_instance(load_spec(TWO_GROUPS), graph, flat_omega(graph))
    tl = replay(ctx, baseline(inst, "highest"))
    slowest = max(t.forward_ms + t.backward_ms + t.optimizer_ms for t in tl.groups.values())
    assert tl.sync_iteration_ms >= slowest
    assert tl.sync_iteration_ms >= tl.groups["a100"].iteration_ms
    assert tl.iteration_ms == tl.sync_iteration_ms  # issue 9: the iteration time is the lockstep one


def test_followers_run_in_their_owners_format():
    graph = conv_chain_graph(batch=32, c=64, hw=32)
    inst, ctx = build_instance(load_spec(TWO_GROUPS), graph, flat_omega(graph))
    t4 = ctx.group("t4")
    assert t4.owner == {"bn1": "conv1", "relu1": "conv1", "bn2": "conv2", "relu2": "conv2"}
    assert t4.other_costs["bn1"]["fp16"].total_ms < t4.other_costs["bn1"]["fp32"].total_ms
    _, ctx32 = build_instance(load_spec(TWO_GROUPS), graph, flat_omega(graph), boundary="fp32")
    assert set(ctx32.group("t4").owner.values()) == {None}


def test_bad_assignments_are_named():
    graph = residual_graph()
    inst, ctx = build_instance(load_spec(ONE_GROUP), graph, flat_omega(graph))
    good = baseline(inst, "highest")
    with pytest.raises(SpecError, match="unknown group"):
        replay(ctx, {**good, "v100": {}})
    with pytest.raises(SpecError, match=r"assignment\['a100'\]: no precision for 1 op"):
        replay(ctx, {"a100": {k: v for k, v in good["a100"].items() if k != "stem"}})
    with pytest.raises(SpecError, match=r"'fp8_e4m3' does not run on A100-40GB"):
        replay(ctx, {"a100": {**good["a100"], "stem": "fp8_e4m3"}})
