"""Ring all-reduce cost, DDP buckets and the exposed (non-overlapped) part."""

from __future__ import annotations

import pytest

from predictor_graphs import mlp_graph
from qsync_opt.errors import SpecError
from qsync_opt.training.predictor.comm import Bucket, allreduce_ms, ddp_buckets, simulate_allreduce


def test_ring_allreduce_by_hand():
    # 100 MB over 4 ranks on 12.5 GB/s, 20 us hops: 2*3/4 * 1e8 / 12.5e6 B/ms + 6 * 0.02 ms
    assert allreduce_ms(1e8, 4, 12.5, 20) == pytest.approx(12.0 + 0.12)


def test_one_rank_needs_no_allreduce():
    assert allreduce_ms(1e8, 1, 12.5, 20) == 0.0


def test_bad_inputs_name_the_field():
    with pytest.raises(SpecError, match="world_size: got 0"):
        allreduce_ms(1e6, 0, 10, 1)
    with pytest.raises(SpecError, match="bucket_mb: got -1"):
        ddp_buckets(mlp_graph(), -1)


def test_buckets_follow_reverse_parameter_order_and_the_cap():
    g = mlp_graph()  # fc1 8320 params (33280 B), fc2 1290 params (5160 B)
    assert ddp_buckets(g) == (Bucket(("fc2", "fc1"), 38440),)
    small = ddp_buckets(g, bucket_mb=4000 / 2**20)  # a 4000-byte cap: each op closes its own bucket
    assert small == (Bucket(("fc2",), 5160), Bucket(("fc1",), 33280))
    assert sum(b.nbytes for b in ddp_buckets(g, bucket_mb=0.01)) == 4 * g.param_count


def test_exposed_time_by_hand():
    # two buckets of 3 ms each: ready at 1 ms and 2 ms; backward ends at 5 ms.
    nbytes = 3.0 * 12.5e6  # 3 ms at 12.5 GB/s between 2 ranks (2*(1)/2 = 1x the bytes)
    buckets = (Bucket(("a",), nbytes), Bucket(("b",), nbytes))
    tl = simulate_allreduce(buckets, {"a": 1.0, "b": 2.0}, 5.0, 2, 12.5, 0.0)
    assert tl.starts == pytest.approx((1.0, 4.0))
    assert tl.ends == pytest.approx((4.0, 7.0))
    assert tl.total_ms == pytest.approx(6.0)
    assert tl.exposed_ms == pytest.approx(2.0)
    hidden = simulate_allreduce(buckets, {"a": 1.0, "b": 2.0}, 9.0, 2, 12.5, 0.0)
    assert hidden.exposed_ms == 0.0
