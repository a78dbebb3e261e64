"""Every quantized operator, at every precision, against a float64 reference: forward and gradients.

The tolerance is not a guess: rt_bounds derives an elementwise worst-case bound from each format
(unit roundoff, subnormal spacing, quantization step) and from fp32 accumulation; see its
docstring. A path that used the wrong scale, the wrong format or a transposed operand lands far
outside it, and each reduced format must also differ from the fp32 result (it really ran).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rt_bounds import U, bilinear_bound, format_error, gamma, out_unit, then_round
from torch import nn
from torch.nn.grad import conv1d_input, conv1d_weight, conv2d_input, conv2d_weight

from qsync_opt.models.layers import MatMul
from qsync_opt.runtime import apply_plan


class Holder(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, *args):
        return self.op(*args)


def _linear():
    mod = nn.Linear(48, 24)
    x = torch.randn(4, 5, 48)
    return dict(
        mod=mod, inputs=(x,), w=mod.weight, b=mod.bias, k=48, kx=24, kw=20, rows=True,
        f=lambda a, w: a @ w.transpose(-1, -2),
        gx=lambda gy, w: gy @ w,
        gw=lambda gy, a: gy.reshape(-1, gy.shape[-1]).t() @ a.reshape(-1, a.shape[-1]),
    )


def _conv2d():
    mod = nn.Conv2d(6, 8, 3, stride=2, padding=1, groups=2)
    x = torch.randn(2, 6, 9, 9)
    args = (2, 1, 1, 2)
    return dict(
        mod=mod, inputs=(x,), w=mod.weight, b=mod.bias, k=27, kx=36, kw=50, rows=True,
        f=lambda a, w: F.conv2d(a, w, None, *args),
        gx=lambda gy, w: conv2d_input(x.shape, w, gy, *args),
        gw=lambda gy, a: conv2d_weight(a, mod.weight.shape, gy, *args),
    )


def _conv1d():
    mod = nn.Conv1d(4, 6, 5, stride=2, padding=2)
    x = torch.randn(2, 4, 20)
    return dict(
        mod=mod, inputs=(x,), w=mod.weight, b=mod.bias, k=20, kx=30, kw=20, rows=True,
        f=lambda a, w: F.conv1d(a, w, None, 2, 2),
        gx=lambda gy, w: conv1d_input(x.shape, w, gy, 2, 2),
        gw=lambda gy, a: conv1d_weight(a, mod.weight.shape, gy, 2, 2),
    )


def _matmul():
    a, b = torch.randn(2, 3, 7, 16), torch.randn(3, 16, 5)
    return dict(
        mod=MatMul(), inputs=(a, b), w=None, b=None, k=16, kx=5, kw=14, rows=False,
        f=lambda x, y: x @ y,
        gx=lambda gy, y: (gy @ y.transpose(-1, -2)).sum_to_size(a.shape),
        gw=lambda gy, x: (x.transpose(-1, -2) @ gy).sum_to_size(b.shape),
    )


OPS = {"linear": _linear, "conv2d": _conv2d, "conv1d": _conv1d, "matmul": _matmul}
# (precision, weight granularity, backward precision, rounding)
VARIANTS = [(p, "per_tensor", "bf16", "nearest") for p in ("tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")]
VARIANTS += [
    ("int8", "per_channel", "bf16", "nearest"),
    ("int4", "per_channel", "bf16", "nearest"),
    ("int8", "per_tensor", "fp32", "nearest"),
    ("int8", "per_tensor", "fp16", "nearest"),
    ("int8", "per_tensor", "bf16", "stochastic"),
    ("fp8_e4m3", "per_tensor", "fp32", "nearest"),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=["-".join(v) for v in VARIANTS])
@pytest.mark.parametrize("op", list(OPS))
def test_forward_and_gradients_within_format_bound(op, variant):
    precision, gran, bwd, rounding = variant
    torch.manual_seed(0)
    case = OPS[op]()
    inputs = [t.clone().requires_grad_(True) for t in case["inputs"]]
    plain_out = Holder(case["mod"])(*case["inputs"]).detach()
    model = apply_plan(Holder(case["mod"]), {"op": precision}, weight_granularity=gran,
                       backward_precision=bwd, rounding=rounding)
    y = model(*inputs)
    gy = torch.randn_like(y)
    y.backward(gy)

    x = case["inputs"][0].double()
    w = (case["w"] if case["w"] is not None else case["inputs"][1]).detach().double()
    bias = None if case["b"] is None else case["b"].detach().double()
    quantized = precision.startswith(("fp8", "int"))
    rows = case["rows"] and gran == "per_channel" and precision.startswith("int")
    stochastic = rounding == "stochastic"

    # forward
    ex = format_error(x, precision, stochastic=stochastic)
    ew = format_error(w, precision, rows=rows, stochastic=stochastic)
    u_out = out_unit(precision)
    bound = bilinear_bound(case["f"], x, ex, w, ew, u_out, case["k"], abs_out=2.0**-25 if precision == "fp16" else 0.0)
    ref = case["f"](x, w)
    if bias is not None:
        u_bias = U.get(precision, 0.0)
        ref = ref + bias.reshape(-1, *[1] * (ref.dim() - 2)) if op.startswith("conv") else ref + bias
        bb = (u_bias + u_out + 2.0**-23) * bias.abs()
        bound = bound + (bb.reshape(-1, *[1] * (ref.dim() - 2)) if op.startswith("conv") else bb)
    assert y.dtype == torch.float32
    err = (y.double() - ref).abs()
    assert (err <= bound).all(), f"forward error {err.max():.3g} exceeds the {precision} bound at {(err / bound).argmax()}"
    if precision != "tf32":
        assert not torch.equal(y.detach(), plain_out), f"{precision} output equals fp32: the format was not applied"

    # gradients: backward dtype is the format itself for bf16/fp16, `bwd` for fp8/int, fp32 for tf32
    bd = bwd if quantized else ("fp32" if precision == "tf32" else precision)
    gyd = gy.double()
    e_gy = format_error(gyd, bd)
    ew_b = then_round(ew, w, bd) if quantized else format_error(w, bd)
    ex_b = then_round(ex, x, bd) if quantized else format_error(x, bd)
    abs_out = 2.0**-25 if bd == "fp16" else 0.0
    gx_bound = bilinear_bound(case["gx"], gyd, e_gy, w, ew_b, U[bd], case["kx"], abs_out)
    gw_bound = bilinear_bound(case["gw"], gyd, e_gy, x, ex_b, U[bd], case["kw"], abs_out)
    gx_ref, gw_ref = case["gx"](gyd, w), case["gw"](gyd, x)
    got_gw = (case["mod"].weight.grad if case["w"] is not None else inputs[1].grad)
    for name, got, want, bnd in (("grad_input", inputs[0].grad, gx_ref, gx_bound), ("grad_weight", got_gw, gw_ref, gw_bound)):
        assert got.dtype == torch.float32 and got.shape == want.shape, name
        gerr = (got.double() - want).abs()
        assert (gerr <= bnd).all(), f"{name} error {gerr.max():.3g} exceeds the bound ({precision}, backward {bd})"
    if bias is not None:
        dims = [d for d in range(gy.dim()) if d != (1 if op.startswith("conv") else gy.dim() - 1)]
        gb_ref = gyd.sum(dims)
        gb_bound = gamma(gy.numel()) * gyd.abs().sum(dims)
        assert ((case["mod"].bias.grad.double() - gb_ref).abs() <= gb_bound).all(), "bias grad is not an fp32 sum"


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4"])
@pytest.mark.parametrize("gran", ["per_tensor", "per_channel"])
def test_embedding_reads_rounded_rows_and_scatters_fp32_gradients(precision, gran):
    torch.manual_seed(0)
    emb = nn.Embedding(50, 16, padding_idx=3)
    idx = torch.tensor([[1, 3, 7, 7], [49, 0, 1, 2]])
    plain = Holder(emb)
    want_out = plain(idx)
    gy = torch.randn_like(want_out)
    want_out.backward(gy)
    want_grad = emb.weight.grad.clone()
    emb.weight.grad = None

    model = apply_plan(Holder(emb), {"op": precision}, weight_granularity=gran)
    y = model(idx)
    y.backward(gy)
    w = emb.weight.detach().double()
    rows = gran == "per_channel" and precision.startswith("int")
    e = format_error(w, precision, rows=rows)[idx]
    assert y.dtype == torch.float32
    assert ((y.double() - w[idx]).abs() <= e * 1.0001).all()
    assert not torch.equal(y.detach(), want_out.detach())
    # the gradient is the plain fp32 scatter, bit for bit (padding row stays zero)
    assert torch.equal(emb.weight.grad, want_grad)
    assert emb.weight.grad[3].abs().sum() == 0
