"""runtime.backward_precision: fp8 — an fp8 linear's two backward GEMMs run on fp8 operands.

The contract: grad_input = Ĝ @ Ŵ and grad_weight = Ĝᵀ @ X̂, where Ĝ is the output gradient quantized to e5m2 with a
per-tensor scale (amax / 57344) and X̂, Ŵ are the e4m3 values the forward saved, computed to fp32 rounding; the
distance to the exact gradient is bounded element by element by the two formats' unit roundoffs. Everything else
(convolutions and matmuls at fp8, integer operators) keeps its 16-bit backward, bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from qsync_opt.runtime.apply import apply_plan
from qsync_opt.runtime.qmodules import SWAPPABLE
from qsync_opt.runtime.recipe import Recipe

E5M2_MAX, E4M3_MAX = 57344.0, 448.0
#: unit roundoff (half the spacing relative to the value) and half the smallest subnormal step, per format
U = {"e5m2": 2.0**-3, "e4m3": 2.0**-4}
HALF_SUB = {"e5m2": 2.0**-17, "e4m3": 2.0**-10}
TORCH = {"e5m2": torch.float8_e5m2, "e4m3": torch.float8_e4m3fn}
MAX = {"e5m2": E5M2_MAX, "e4m3": E4M3_MAX}


def fp8_values(t: torch.Tensor, fmt: str) -> tuple[torch.Tensor, float]:
    """t rounded to `fmt` under a per-tensor scale amax / max, in float64, and the scale (written out here, not
    taken from the package)."""
    s = float(t.abs().max()) / MAX[fmt]
    return (t / s).clamp(-MAX[fmt], MAX[fmt]).to(TORCH[fmt]).double() * s, s


def swapped(lin: nn.Linear, precision: str, backward: str) -> nn.Module:
    return SWAPPABLE[nn.Linear].from_float(copy.deepcopy(lin), Recipe(precision, backward))


def grads(m: nn.Module, x: torch.Tensor, gy: torch.Tensor):
    xx = x.clone().requires_grad_(True)
    m(xx).backward(gy)
    return xx.grad, m.weight.grad, m.bias.grad


@pytest.fixture
def case():
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(96, 80)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(80, 96, generator=g) * 0.1)
    x = torch.randn(3, 20, 96, generator=g)
    gy = torch.randn(3, 20, 80, generator=g) * 1e-3
    return lin, x, gy


def test_fp8_linear_backward_is_the_gemm_of_the_fp8_values(case):
    lin, x, gy = case
    gx, gw, gb = grads(swapped(lin, "fp8_e4m3", "fp8"), x, gy)
    g2, x2 = gy.reshape(-1, 80), x.reshape(-1, 96)
    gv, _ = fp8_values(g2, "e5m2")
    wv, _ = fp8_values(lin.weight.detach(), "e4m3")
    xv, _ = fp8_values(x2, "e4m3")
    want_x, want_w = (gv @ wv).reshape(3, 20, 96), gv.t() @ xv
    for got, want, k in ((gx, want_x, 80), (gw, want_w, 60)):
        assert got.dtype == torch.float32
        slack = k * 2.0**-24 * float((gv.abs().max())) * float(max(wv.abs().max(), xv.abs().max())) * 2
        assert float((got.double() - want).abs().max()) <= slack
    assert torch.equal(gb, g2.sum(0)), "the bias gradient is summed in fp32 from the unquantized gradient"


def test_fp8_backward_error_is_bounded_by_the_formats_unit_roundoff(case):
    lin, x, gy = case
    gx, gw, _ = grads(swapped(lin, "fp8_e4m3", "fp8"), x, gy)
    g2, x2, w = gy.reshape(-1, 80).double(), x.reshape(-1, 96).double(), lin.weight.detach().double()
    _, sg = fp8_values(g2.float(), "e5m2")
    _, sw = fp8_values(w.float(), "e4m3")
    _, sx = fp8_values(x2.float(), "e4m3")

    def bound(a, fa, sa, b, fb, sb):  # |Â B̂ - A B| <= (|A|(1+u_a)+e_a)(|B|(1+u_b)+e_b) - |A||B|, + fp32 sums
        ha, hb = a.abs() * (1 + U[fa]) + HALF_SUB[fa] * sa, b.abs() * (1 + U[fb]) + HALF_SUB[fb] * sb
        return ha @ hb - a.abs() @ b.abs() + a.shape[1] * 2.0**-23 * (ha @ hb)

    err_x = (gx.reshape(-1, 96).double() - g2 @ w).abs()
    err_w = (gw.double() - g2.t() @ x2).abs()
    assert bool((err_x <= bound(g2, "e5m2", sg, w, "e4m3", sw)).all())
    assert bool((err_w <= bound(g2.t(), "e5m2", sg, x2, "e4m3", sx)).all())
    # and it is the e5m2 gradient that costs: a 16-bit backward is closer
    gx16, _, _ = grads(swapped(lin, "fp8_e4m3", "bf16"), x, gy)
    exact = (g2 @ w).reshape(gx.shape)
    assert float((gx.double() - exact).norm()) > float((gx16.double() - exact).norm())


def test_e5m2_forward_with_fp8_backward(case):
    lin, x, gy = case
    gx, gw, _ = grads(swapped(lin, "fp8_e5m2", "fp8"), x, gy)
    gv, _ = fp8_values(gy.reshape(-1, 80), "e5m2")
    wv, _ = fp8_values(lin.weight.detach(), "e5m2")
    want = (gv @ wv).reshape(gx.shape)
    assert float((gx.double() - want).abs().max()) <= 80 * 2.0**-23 * float(gv.abs().max() * wv.abs().max())


def test_other_quantized_operators_keep_their_16_bit_backward():
    g = torch.Generator().manual_seed(1)
    conv, lin = nn.Conv2d(4, 6, 3, padding=1), nn.Linear(12, 5)
    for base, shape, precision in ((conv, (2, 4, 6, 6), "fp8_e4m3"), (lin, (7, 12), "int8"),
                                   (lin, (7, 12), "int4"), (lin, (7, 12), "bf16")):
        x = torch.randn(shape, generator=g)
        out = {}
        for backward in ("fp8", "bf16"):
            m = apply_plan(copy.deepcopy(base), {"": precision}, backward_precision=backward)
            xx = x.clone().requires_grad_(True)
            y = m(xx)
            y.backward(torch.ones_like(y))
            out[backward] = (xx.grad, m.weight.grad)
        assert torch.equal(out["fp8"][0], out["bf16"][0]) and torch.equal(out["fp8"][1], out["bf16"][1]), precision


def test_recipe_and_apply_plan_take_fp8_backward():
    r = Recipe("fp8_e4m3", "fp8")
    assert r.fp8_backward and r.backward_dtype == torch.bfloat16 and "backward=fp8" in r.describe()
    assert not Recipe("int8", "fp8").fp8_backward and Recipe("int8", "fp8").backward_dtype == torch.bfloat16
    m = apply_plan(nn.Sequential(nn.Linear(8, 8)), {"0": "fp8_e4m3"}, backward_precision="fp8")
    assert m[0].recipe.fp8_backward


def test_a_gradient_of_zeros_gives_zero_gradients(case):
    lin, x, gy = case
    gx, gw, gb = grads(swapped(lin, "fp8_e4m3", "fp8"), x, torch.zeros_like(gy))
    assert not gx.any() and not gw.any() and not gb.any()


def test_the_runtime_backward_is_the_format_the_planner_priced_on_that_device():
    """apply_plan given the group's device runs DeviceSpec.backward_format: a T4 runs fp16 where bf16 is asked (it
    has no bf16; the planner priced fp16), 'fp8' stays fp8 only where the device runs fp8."""
    from qsync_opt.hardware.device import find_device
    from qsync_opt.training.predictor.casts import resolve_backward_precision

    def recipe(device, precision, backward):
        m = apply_plan(nn.Sequential(nn.Linear(8, 8)), {"0": precision}, backward_precision=backward,
                       device=find_device(device))
        return m[0].recipe

    assert recipe("T4", "int8", "bf16").backward == "fp16" == resolve_backward_precision("bf16", find_device("T4"))
    assert recipe("A100-80GB", "int8", "bf16").backward == "bf16"
    assert recipe("H100-SXM", "fp8_e4m3", "fp8").fp8_backward
    assert recipe("A100-80GB", "int8", "fp8").backward == "bf16"  # no fp8 here: the 16-bit backward
    assert recipe("L4", "int8", "fp8").backward_dtype == torch.bfloat16
