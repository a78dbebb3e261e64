"""The analytic cost rules that the tracer applies to non-GEMM ops."""

from __future__ import annotations

import pytest

from qsync_opt.models.flops import op_cost


def test_gemm_rules():
    conv = op_cost("conv2d", ((2, 3, 8, 8),), (2, 4, 8, 8), weight_shape=(4, 3, 3, 3), has_bias=True)
    assert conv.fwd_flops == 2 * (2 * 4 * 64) * 27 + 2 * 4 * 64
    assert conv.bwd_flops == 2 * conv.fwd_flops and conv.saved_bytes == 4 * 2 * 3 * 64
    grouped = op_cost("conv2d", ((1, 8, 4, 4),), (1, 8, 4, 4), weight_shape=(8, 1, 3, 3))
    assert grouped.fwd_flops == 2 * 8 * 16 * 9  # depthwise: Cin/groups = 1
    mm = op_cost("matmul", ((3, 5, 7), (3, 7, 2)), (3, 5, 2))
    assert mm.fwd_flops == 2 * 3 * 5 * 2 * 7 and mm.saved_bytes == 4 * (105 + 42)


@pytest.mark.parametrize(
    "kind, fwd, bwd, saved",
    [
        ("layer_norm", 5 * 64, 10 * 64, 4 * 64),
        ("softmax", 5 * 64, 10 * 64, 4 * 64),
        ("relu", 64, 64, 4 * 64),
        ("gelu", 64, 64, 4 * 64),
        ("add", 64, 64, 0),
        ("dropout", 64, 64, 64),
    ],
)
def test_elementwise_and_norm_rules(kind, fwd, bwd, saved):
    c = op_cost(kind, ((4, 16),), (4, 16))
    assert (c.fwd_flops, c.bwd_flops, c.saved_bytes) == (fwd, bwd, saved)


def test_embedding_and_pool_and_leaf_rules():
    emb = op_cost("embedding", ((2, 10),), (2, 10, 32), weight_shape=(100, 32))
    assert (emb.fwd_flops, emb.saved_bytes) == (640, 8 * 20)  # gather; int64 indices kept
    pool = op_cost("pool", ((1, 4, 8, 8),), (1, 4, 4, 4), window=9)
    assert pool.fwd_flops == 64 * 9
    gap = op_cost("pool", ((1, 4, 8, 8),), (1, 4, 1, 1))
    assert gap.fwd_flops == 256 and gap.saved_bytes == 0
    leaf = op_cost("leaf", ((2, 5, 16),), (2, 5, 16), param_count=100)
    assert leaf.fwd_flops == 2 * 100 * 10 and leaf.bwd_flops == 2 * leaf.fwd_flops
