"""weight_stats, the three numbers every weight-noise figure is made of: exact where they must be."""

import torch

from qsync_opt.training.predictor.indicator import weight_stats


def test_sum_of_squares_is_the_double_precision_sum_and_max_is_exact():
    g = torch.Generator().manual_seed(0)
    # a BERT-sized embedding (30522 x 768 is 23M; 6M keeps the test quick) drawn as transformers does, plus odd tails
    for shape in [(6_000_000,), (3072, 768), (1000,), (5,), (2 ** 18 + 3,)]:
        w = torch.empty(shape).normal_(0.0, 0.02, generator=g)
        n, amax, sumsq = weight_stats(w)
        exact = float((w.double() ** 2).sum())
        assert n == w.numel()
        assert amax == float(w.abs().max())
        assert abs(sumsq - exact) <= 1e-6 * exact, shape


def test_stats_of_a_parameter_and_of_a_non_contiguous_view():
    w = torch.nn.Parameter(torch.randn(64, 48))
    st = weight_stats(w)
    assert st == weight_stats(w.detach().clone())
    t = weight_stats(w.detach().t())  # a transposed view: the same values, so the same statistics
    assert t[0] == st[0] and t[1] == st[1] and abs(t[2] - st[2]) <= 1e-6 * st[2]
    assert weight_stats(torch.empty(0)) == (0, 0.0, 0.0)
