"""c(L) from FLOPs agrees with the per-op rules of models/flops.py, and the fit recovers a
known cost curve."""

import pytest
from torch import nn

from qsync_opt.errors import SpecError
from qsync_opt.loading.cost import fit, from_module, from_shape, relative_speeds
from qsync_opt.models.flops import op_cost


def test_from_shape_matches_op_rules():
    d, layers, L = 64, 3, 100
    lin = op_cost("linear", ((1, L, d),), (1, L, 4 * d), weight_shape=(4 * d, d))
    sdpa = op_cost("sdpa", ((1, 2, L, d // 2), (1, 2, L, d // 2)), (1, 2, L, d // 2))
    c = from_shape(4 * d * d, layers, d)
    assert c.a * L == pytest.approx(lin.fwd_flops + lin.bwd_flops)
    assert c.b * L * L == pytest.approx(layers * (sdpa.fwd_flops + sdpa.bwd_flops))


def test_from_module_counts_tied_weights_once():
    emb = nn.Embedding(10, 8)
    head = nn.Linear(8, 10, bias=False)
    head.weight = emb.weight
    m = nn.Sequential(nn.Linear(8, 8), head)
    assert from_module(m, layers=1, hidden=8).a == 6 * (64 + 80)


def test_fit_recovers_curve():
    Ls = [32, 64, 128, 256, 512]
    ts = [1e-3 + 2e-5 * L + 3e-8 * L * L for L in Ls]
    c = fit(Ls, ts)
    assert (c.c0, c.a, c.b) == pytest.approx((1e-3, 2e-5, 3e-8), rel=1e-6)
    lin = fit(Ls, [5e-5 * L for L in Ls])  # a negative b would fit noise: NNLS keeps b >= 0
    assert lin.b >= 0 and lin(100) == pytest.approx(5e-3, rel=1e-6)


def test_fit_and_speeds_refuse_bad_input():
    with pytest.raises(SpecError):
        fit([10], [1.0])
    with pytest.raises(SpecError):
        relative_speeds([1.0, 0.0])
    assert relative_speeds([2.0, 1.0, 4.0]) == [0.5, 1.0, 0.25]
