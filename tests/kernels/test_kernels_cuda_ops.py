"""kernels.ops and the runtime on CUDA tensors: each dispatched path against the reference arithmetic.

Needs a CUDA device and a CUDA build of torch (skipped otherwise; selected by `pytest -m cuda`).
The templated paths build the CUDA extension once (cached on disk).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from qsync_opt.kernels import dispatch, ops, reference
from qsync_opt.kernels.dispatch import Target, cuda_gemm_kinds, gemm_impl

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def target():
    return Target.of_tensor(torch.empty(0, device="cuda"))


def _codes(m, k, n, qmax, seed=0):
    g = torch.Generator().manual_seed(seed)
    xq = torch.randint(-qmax, qmax + 1, (m, k), dtype=torch.int8, generator=g).cuda()
    wq = torch.randint(-qmax, qmax + 1, (n, k), dtype=torch.int8, generator=g).cuda()
    return xq, torch.tensor(0.02).cuda(), wq, (torch.rand(n, generator=g) + 0.01).cuda(), torch.randn(n, generator=g).cuda()


@pytest.mark.parametrize("impl", ["auto", "templated", "torch"])
@pytest.mark.parametrize("m,k,n", [(1, 16, 8), (33, 101, 40), (512, 1024, 768)])
def test_int8_linear_every_impl_is_bit_exact(target, impl, m, k, n):
    if impl == "templated" and "int8" not in cuda_gemm_kinds(target.sm):
        pytest.skip(f"no templated int8 GEMM on {target.label}")
    xq, sx, wq, sw, b = _codes(m, k, n, 127)
    y = ops.int8_linear(xq, sx, wq, sw, b, impl=impl)
    assert y.is_cuda and torch.equal(y.cpu(), reference.int8_linear(xq.cpu(), sx.cpu(), wq.cpu(), sw.cpu(), b.cpu(),
                                                                      torch.float32))


@pytest.mark.parametrize("m,k,n", [(8, 32, 8), (33, 101, 40), (256, 512, 384)])
def test_int4_linear_is_bit_exact_on_whatever_dispatch_runs(target, m, k, n):
    xq, sx, wq, sw, b = _codes(m, k, n, 7, seed=1)
    y = ops.int4_linear(xq, sx, wq, sw, b)
    assert torch.equal(y.cpu(), reference.int8_linear(xq.cpu(), sx.cpu(), wq.cpu(), sw.cpu(), b.cpu(), torch.float32))


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_quantize_dequantize_absmax_match_the_cpu_reference(axis):
    x = torch.randn(300, 517) * 3
    q, s = ops.quantize_symmetric(x.cuda(), axis=axis)
    qr, sr = reference.quantize(x, bits=8, axis=axis, scale=None, stochastic=False, generator=None)
    assert torch.equal(q.cpu(), qr) and torch.equal(s.cpu(), sr)
    assert torch.equal(ops.dequantize(q, s, axis=axis).cpu(), reference.dequantize(qr, sr, axis=axis,
                                                                                   dtype=torch.float32))
    assert torch.equal(ops.absmax(x.cuda(), axis=axis).cpu(), reference.absmax(x, axis))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_quantize_and_linear(target, fmt):
    x, w = torch.randn(70, 200) * 5, torch.randn(90, 200)
    xq, sx = ops.quantize_fp8(x.cuda(), fmt)
    xr, sxr = ops.quantize_fp8(x, fmt)
    assert torch.equal(sx.cpu(), sxr) and torch.equal(xq.cpu().view(torch.uint8), xr.view(torch.uint8))
    wq, sw = ops.quantize_fp8(w.cuda(), fmt)
    ref = (xq.double() @ wq.double().t()) * (sx.double() * sw.double())
    for impl in ("auto", "torch") + (("templated",) if target.sm and target.sm >= 89 else ()):
        y = ops.fp8_linear(xq, sx, wq, sw, None, impl=impl)
        # the inputs are exact fp8 values: only accumulation rounds, by the bound of the implementation
        # ('auto' on sm_90 is torch._scaled_mm, whose tensor cores accumulate in fewer bits than fp32)
        rel = float((y.double() - ref).norm() / ref.norm())
        assert rel <= reference.fp8_gemm_tolerance(x.shape[1], impl), (impl, rel)
    if fmt == "e4m3" and gemm_impl(target, "fp8_e4m3").op == dispatch.SCALED_MM:  # fp8 training's forward GEMM
        y = ops.fp8_linear(xq, sx, wq, sw, None, fast_accum=True)
        rel = float((y.double() - ref).norm() / ref.norm())
        assert rel <= reference.fp8_gemm_tolerance(x.shape[1], "auto"), ("fast accumulation", rel)


@pytest.mark.parametrize("precision", ["int8", "int4", "fp8_e4m3", "bf16"])
def test_runtime_modules_on_cuda_match_cpu(target, precision):
    """A QLinear and a QConv2d give the CPU runtime's forward on CUDA (integer paths bit for bit)."""
    from qsync_opt.runtime.qmodules import SWAPPABLE
    from qsync_opt.runtime.recipe import Recipe

    if gemm_impl(target, precision).via == "fp32":
        pytest.skip(f"{precision} is emulated through fp32 on {target.label}")
    torch.manual_seed(0)
    for base, x in ((nn.Linear(64, 48), torch.randn(17, 64)), (nn.Conv2d(8, 16, 3, padding=1), torch.randn(2, 8, 9, 9))):
        recipe = Recipe(precision, "bf16" if torch.cuda.is_bf16_supported() else "fp16", "per_channel")
        cpu = SWAPPABLE[type(base)].from_float(base, recipe)
        y_cpu = cpu(x)
        gpu = SWAPPABLE[type(base)].from_float(copy.deepcopy(base).cuda(), recipe)
        xg = x.cuda().requires_grad_(True)
        y = gpu(xg)
        y.sum().backward()
        assert xg.grad is not None and torch.isfinite(xg.grad).all()
        if precision in ("int8", "int4"):
            assert torch.equal(y.detach().cpu(), y_cpu.detach())
        else:
            assert torch.allclose(y.detach().cpu(), y_cpu.detach(), rtol=2e-2, atol=2e-2)

