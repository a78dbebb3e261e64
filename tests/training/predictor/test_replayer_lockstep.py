"""Lockstep replay on a hand-built two-group job whose timeline is worked out by hand.

Graph a -> b (both with weights). Group 'fast': a, b take 1 ms forward, 2 ms backward;
'slow' twice that; optimizer 1 ms each. One rank per group, link 1 GB/s, no latency, so a
ring all-reduce of N bytes over 2 ranks takes N / 1e6 ms. Buckets in reverse order: (b,)
1 MB = 1 ms, then (a,) 3 MB = 3 ms.

  fast alone: forward 0-2, b bwd 2-4, a bwd 4-6; bucket b 4-5, bucket a 6-9 -> exposed 3;
              compute 2 + 4 + 1 = 7; own iteration 10.
  slow alone: forward 0-4, b bwd 4-8, a bwd 8-12; bucket b 8-9, bucket a 12-15 -> exposed 3;
              compute 4 + 8 + 1 = 13; own iteration 16.
  lockstep:   bucket b waits for slow's b gradient (8) -> 8-9, overlapping slow's backward of a;
              bucket a waits for slow's a gradient (12) -> 12-15; both optimizers 15-16.
              iteration 16; idle: fast 16 - 7 - 3 = 6 (straggler wait), slow 0.
"""

from __future__ import annotations

import json

import pytest

from qsync_opt.models.graph import OpGraph, OpNode
from qsync_opt.training.predictor.comm import Bucket, ddp_buckets
from qsync_opt.training.predictor.context import Context, GroupContext
from qsync_opt.training.predictor.costs import OpCost
from qsync_opt.training.predictor.memory import memory_model
from qsync_opt.training.predictor.replayer import replay
from qsync_opt.training.predictor.timeline_export import chrome_trace, write_chrome_trace, write_png
from qsync_opt.hardware.device import find_device


def _node(name, params, depth):
    return OpNode(name, "linear", True, ((1, 4),), (1, 4), 8, 16, params, 0, depth, (4, 4))


GRAPH = OpGraph("hand", 1, (_node("a", 16, 0), _node("b", 16, 1)), (("a", "b"),), (("a", "b"),), {("a", "b"): 4}, 2)
BUCKETS = (Bucket(("b",), 1_000_000), Bucket(("a",), 3_000_000))


def _group(name, scale):
    costs = {op: {"fp32": OpCost(1.0 * scale, 2.0 * scale)} for op in ("a", "b")}
    return GroupContext(
        name=name, device=find_device("cpu-local"), count=1, local_batch=1, role="inference", graph=GRAPH,
        backward_precision="fp32", allowed={"a": ("fp32",), "b": ("fp32",)}, costs=costs, other_costs={},
        owner={}, optimizer_ms=1.0, memory=memory_model(GRAPH, ("fp32",), "sgd", world_size=2, owner={}),
        buckets=BUCKETS, mem_capacity_bytes=1e12, boundary="fp32",
    )


CTX = Context(groups=(_group("fast", 1), _group("slow", 2)), world_size=2, link_bandwidth_gbs=1.0,
              link_latency_us=0.0, global_batch=2)
PLAN = {"fast": {"a": "fp32", "b": "fp32"}, "slow": {"a": "fp32", "b": "fp32"}}


def test_each_group_alone_by_hand():
    tl = replay(CTX, PLAN)
    fast, slow = tl.groups["fast"], tl.groups["slow"]
    assert fast.grad_ready_ms == {"b": 2.0, "a": 4.0}
    assert fast.comm.starts == (2.0, 4.0) and fast.comm.ends == (3.0, 7.0)  # from backward's start
    assert (fast.compute_ms, fast.comm_exposed_ms, fast.iteration_ms) == (7.0, 3.0, 10.0)
    assert (slow.compute_ms, slow.comm_exposed_ms, slow.iteration_ms) == (13.0, 3.0, 16.0)


def test_lockstep_waits_for_the_straggler_by_hand():
    tl = replay(CTX, PLAN)
    assert tl.bucket_starts == (8.0, 12.0)
    assert tl.bucket_ends == (9.0, 15.0)
    assert tl.iteration_ms == tl.sync_iteration_ms == 16.0
    assert tl.idle_ms == {"fast": 6.0, "slow": 0.0}
    # bucket b's all-reduce (8-9) overlaps slow's backward of a (8-12): nothing of it is exposed
    a_bwd = next(e for e in tl.groups["slow"].events if e[0] == "backward" and e[1].startswith("a "))
    assert a_bwd[2:] == (8.0, 4.0)


def test_first_bucket_is_small_then_the_cap_in_reverse_order():
    mib = 2**20
    nodes = tuple(_node(f"p{i}", int(0.6 * mib / 4), i) for i in range(1, 7))
    g = OpGraph("six", 1, nodes, (), ())
    buckets = ddp_buckets(g, bucket_mb=2.0)
    assert [b.ops for b in buckets] == [("p6", "p5"), ("p4", "p3", "p2", "p1")]
    assert buckets[0].nbytes == 2 * 4 * int(0.6 * mib / 4)
    # without the small first bucket, the 2 MiB cap would take p6..p3 first
    assert [b.ops for b in ddp_buckets(g, bucket_mb=2.0, first_bucket_mb=2.0)][0] == ("p6", "p5", "p4", "p3")


def test_chrome_trace_and_png(tmp_path):
    tl = replay(CTX, PLAN)
    trace = chrome_trace(tl)
    x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    comm = sorted((e["ts"], e["dur"]) for e in x if e["pid"] == 1 and e["tid"] == 2)
    assert comm == [(8000.0, 1000.0), (12000.0, 3000.0)]
    opt = [e for e in x if e["cat"] == "optimizer"]
    assert sorted(e["ts"] for e in opt) == [15000.0, 15000.0]
    wait = [e for e in x if e["cat"] == "idle" and e["pid"] == 1]
    assert [(e["ts"], e["dur"]) for e in wait] == [(6000.0, 9000.0)]  # fast: backward ends at 6, waits to 15
    path = write_chrome_trace(tl, tmp_path / "t.json")
    assert json.loads(path.read_text())["otherData"]["iteration_ms"] == 16.0
    png = write_png(tl, tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("bad", [{"fast": {"a": "fp32"}, "slow": PLAN["slow"]}])
def test_bad_plans_are_named(bad):
    from qsync_opt.errors import SpecError

    with pytest.raises(SpecError, match="fast"):
        replay(CTX, bad)
