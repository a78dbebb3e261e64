"""Integer operators are bit-exact against integer arithmetic when the scales are exact.

Inputs are integers times a power of two, with the largest magnitude present, so the scale
amax/qmax is that power of two exactly, x/scale is the integer itself, and the int32
accumulator times the product of two powers of two is exact in fp32 (|acc| < 2^24). Any
rounding, clamping, transposition or epilogue mistake shows up as a mismatch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qsync_opt.kernels import ops, reference
from qsync_opt.models.layers import MatMul
from qsync_opt.runtime import apply_plan

QMAX = {"int8": 127, "int4": 7}
IMPLS = ["torch"] + (["templated"] if ops.available("templated") and reference.cpu_int_mm_exact() else [])


def _ints(shape, qmax, gen, rows=False):
    t = torch.randint(-qmax, qmax + 1, shape, generator=gen)
    if rows:  # every output channel reaches qmax, so per-channel scales are exact too
        t.reshape(shape[0], -1)[:, 0] = qmax
    else:
        t.reshape(-1)[0] = -qmax
    return t


class Holder(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, *a):
        return self.op(*a)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("gran", ["per_tensor", "per_channel"])
@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("op", ["linear", "conv2d", "conv2d-reflect-same", "conv1d-groups", "matmul"])
def test_integer_forward_is_bit_exact(op, precision, gran, impl):
    g = torch.Generator().manual_seed(1)
    q = QMAX[precision]
    sx, sw = 2.0**-5, 2.0**-6
    if op == "linear":
        mod = nn.Linear(40, 12)
        xi, wi = _ints((3, 5, 40), q, g), _ints((12, 40), q, g, rows=True)
        ref = lambda xx, ww: xx @ ww.t()  # noqa: E731
    elif op == "conv2d":
        mod = nn.Conv2d(4, 6, 3, stride=2, padding=1)
        xi, wi = _ints((2, 4, 9, 9), q, g), _ints((6, 4, 3, 3), q, g, rows=True)
        ref = lambda xx, ww: F.conv2d(xx, ww, None, 2, 1)  # noqa: E731
    elif op == "conv2d-reflect-same":
        mod = nn.Conv2d(4, 6, 3, padding="same", padding_mode="reflect")
        xi, wi = _ints((2, 4, 7, 7), q, g), _ints((6, 4, 3, 3), q, g, rows=True)
        ref = lambda xx, ww: F.conv2d(F.pad(xx, (1, 1, 1, 1), mode="reflect"), ww)  # noqa: E731
    elif op == "conv1d-groups":
        mod = nn.Conv1d(6, 4, 3, stride=1, padding=2, dilation=2, groups=2)
        xi, wi = _ints((2, 6, 15), q, g), _ints((4, 3, 3), q, g, rows=True)
        ref = lambda xx, ww: F.conv1d(xx, ww, None, 1, 2, 2, 2)  # noqa: E731
    else:
        mod = MatMul()
        xi, wi = _ints((2, 3, 6, 16), q, g), _ints((3, 16, 5), q, g)
        sw = 2.0**-5 * 2  # b is an activation: per-tensor scale 2^-4
        ref = lambda xx, ww: xx @ ww  # noqa: E731
    x = xi.float() * sx
    if op == "matmul":
        w = wi.float() * sw
        args = (x, w)
    else:
        with torch.no_grad():
            mod.weight.copy_(wi.float() * sw)
            mod.bias.copy_(torch.randint(-100, 100, mod.bias.shape, generator=g).float() * sx * sw)
        args = (x,)
    model = apply_plan(Holder(mod), {"op": precision}, kernels=impl, weight_granularity=gran)
    y = model(*args)
    want = ref(xi.double(), wi.double()) * (sx * sw)
    if op != "matmul":
        b = mod.bias.double()
        want = want + (b if op == "linear" else b.reshape(-1, *[1] * (want.dim() - 2)))
    assert torch.equal(y.double(), want), f"max diff {(y.double() - want).abs().max()}"


def test_int4_clamps_to_seven_levels_each_side():
    lin = nn.Linear(32, 8)
    model = apply_plan(Holder(lin), {"op": "int4"})
    x = torch.randn(16, 32)
    seen = {}

    def spy(xq, sx, wq, sw, bias, **kw):
        seen["x"], seen["w"] = xq, wq
        return orig(xq, sx, wq, sw, bias, **kw)

    orig = ops.int8_linear
    try:
        ops.int8_linear = spy
        model(x)
    finally:
        ops.int8_linear = orig
    for t in seen.values():
        assert t.dtype == torch.int8 and int(t.abs().max()) == 7


def test_stochastic_rounding_is_unbiased_and_seeded():
    lin = nn.Linear(64, 4)
    model = apply_plan(Holder(lin), {"op": "int4"}, rounding="stochastic")
    x = torch.randn(8, 64)
    torch.manual_seed(3)
    a = model(x)
    torch.manual_seed(3)
    b = model(x)
    c = model(x)
    assert torch.equal(a, b), "same seed, same rounding"
    assert not torch.equal(b, c), "stochastic rounding draws fresh noise"
    mean = torch.stack([model(x) for _ in range(300)]).mean(0).detach()
    nearest = apply_plan(Holder(nn.Linear(64, 4)), {"op": "fp32"})
    nearest.op.load_state_dict(lin.state_dict())
    exact = nearest(x).detach()
    # unbiased: the average over draws approaches the exact product much closer than one int4 draw does
    assert (mean - exact).abs().mean() < 0.5 * (c.detach() - exact).abs().mean()
