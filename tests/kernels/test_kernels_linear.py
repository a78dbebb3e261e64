"""int8_linear: bit-exact against integer arithmetic, int4 through the same GEMM, bf16 output, errors."""

from __future__ import annotations

import pytest
import torch

from qsync_opt.errors import SpecError
from qsync_opt.kernels import ops

INT8_GEMM = True
"""The `impl` fixture skips impl='templated' where the CPU's oneDNN int8 GEMM is not exact (conftest.py)."""
SHAPES = [(1, 1, 1), (5, 7, 3), (16, 64, 8), (17, 64, 5), (33, 100, 30), (130, 515, 257), (256, 768, 384)]


def integer_reference(xq, sx, wq, sw, bias, out_dtype):
    """int64 matmul of the int tensors, then the documented fp32 epilogue: (acc * (sx * sw)) + bias."""
    acc = (xq.long() @ wq.long().T).float()
    y = acc * (sx.float().reshape(()) * sw.float().reshape(-1))
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def random_operands(m, k, n, qmax=127, seed=0):
    g = torch.Generator().manual_seed(seed)
    xq = torch.randint(-qmax, qmax + 1, (m, k), dtype=torch.int8, generator=g)
    wq = torch.randint(-qmax, qmax + 1, (n, k), dtype=torch.int8, generator=g)
    sx = torch.rand((), generator=g) * 0.05 + 1e-3
    sw = torch.rand(n, generator=g) * 0.05 + 1e-3
    bias = torch.randn(n, generator=g)
    return xq, sx, wq, sw, bias


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["sw-channel", "sw-tensor"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("m,k,n", SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
def test_bit_exact_against_integer_reference(impl, m, k, n, with_bias, per_channel, out_dtype):
    xq, sx, wq, sw, bias = random_operands(m, k, n, seed=m * 7 + n)
    sw = sw if per_channel else sw[:1].reshape(())
    bias = bias if with_bias else None
    y = ops.int8_linear(xq, sx, wq, sw, bias, out_dtype=out_dtype, impl=impl)
    assert y.shape == (m, n) and y.dtype == out_dtype
    assert torch.equal(y, integer_reference(xq, sx, wq, sw, bias, out_dtype))


def test_non_contiguous_operands(impl):
    xq, sx, wq, sw, bias = random_operands(64, 40, 30)
    xt, wt = xq.T.contiguous().T, wq.T.contiguous().T  # same values, transposed strides
    assert not xt.is_contiguous()
    y = ops.int8_linear(xt, sx, wt, sw, bias, impl=impl)
    assert torch.equal(y, integer_reference(xq, sx, wq, sw, bias, torch.float32))


def test_int4_values_use_the_same_gemm_bit_exactly(impl):
    x, w = torch.randn(64, 96), torch.randn(48, 96)
    xq, sx = ops.quantize_symmetric(x, bits=4, impl=impl)
    wq, sw = ops.quantize_symmetric(w, bits=4, axis=0, impl=impl)
    assert xq.abs().max() <= 7 and wq.abs().max() <= 7
    y = ops.int8_linear(xq, sx, wq, sw, None, impl=impl)
    assert torch.equal(y, integer_reference(xq, sx, wq, sw, None, torch.float32))


def test_extreme_accumulators_are_exact(impl):
    # every product is 127*127: acc = K * 16129 needs all 31 bits of care at K = 131071 (the limit)
    k = 8192
    xq = torch.full((20, k), 127, dtype=torch.int8)
    wq = torch.full((9, k), -127, dtype=torch.int8)
    one = torch.tensor(1.0)
    y = ops.int8_linear(xq, one, wq, one, None, impl=impl)
    assert torch.equal(y, torch.full((20, 9), float(-k * 127 * 127)))


def test_bf16_output_is_the_rounded_fp32_output(impl):
    xq, sx, wq, sw, bias = random_operands(40, 200, 24)
    y32 = ops.int8_linear(xq, sx, wq, sw, bias, out_dtype=torch.float32, impl=impl)
    y16 = ops.int8_linear(xq, sx, wq, sw, bias, out_dtype=torch.bfloat16, impl=impl)
    assert torch.equal(y16, y32.to(torch.bfloat16))
    assert torch.allclose(y16.float(), y32, rtol=2**-8, atol=0)  # half a bf16 ulp, relative


def test_quantized_linear_approximates_the_float_linear(impl):
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(128, 512, generator=g), torch.randn(256, 512, generator=g) * 0.05, torch.randn(256, generator=g)
    xq, sx = ops.quantize_symmetric(x, impl=impl)
    wq, sw = ops.quantize_symmetric(w, axis=0, impl=impl)
    y = ops.int8_linear(xq, sx, wq, sw, b, impl=impl)
    ref = x @ w.T + b
    rel = (y - ref).norm() / (ref - b).norm()
    assert rel < 0.02  # int8 per-channel: about 1% relative error on Gaussian data


def test_auto_falls_back_to_torch_for_what_the_build_lacks(cpu_module):
    xq, sx, wq, sw, bias = random_operands(20, 30, 10)
    y = ops.int8_linear(xq, sx, wq, sw, bias, out_dtype=torch.float16)  # fp16 output: torch path
    assert torch.equal(y, integer_reference(xq, sx, wq, sw, bias, torch.float16))
    with pytest.raises(SpecError, match="impl='templated'.*float16"):
        ops.int8_linear(xq, sx, wq, sw, bias, out_dtype=torch.float16, impl="templated")
    empty = ops.int8_linear(xq[:0], sx, wq, sw, bias)
    assert empty.shape == (0, 10)


def test_bad_arguments_name_the_field():
    xq, sx, wq, sw, bias = random_operands(4, 6, 3)
    with pytest.raises(SpecError, match=r"wq: shape \(3, 5\) does not match xq's K=6"):
        ops.int8_linear(xq, sx, wq[:, :5], sw, bias)
    with pytest.raises(SpecError, match="xq: expected a 2-d int8 tensor, got torch.float32"):
        ops.int8_linear(xq.float(), sx, wq, sw, bias)
    with pytest.raises(SpecError, match=r"bias: expected 3 values, got \(4,\)"):
        ops.int8_linear(xq, sx, wq, sw, torch.zeros(4))
    with pytest.raises(SpecError, match="sw: got"):
        ops.int8_linear(xq, sx, wq, torch.ones(2), bias)
    with pytest.raises(SpecError, match="sx: got"):
        ops.int8_linear(xq, torch.ones(2), wq, sw, bias)
    with pytest.raises(SpecError, match="out_dtype"):
        ops.int8_linear(xq, sx, wq, sw, bias, out_dtype=torch.int32)
    with pytest.raises(SpecError, match="K=200000 exceeds"):
        ops.int8_linear(torch.zeros(1, 200_000, dtype=torch.int8), sx, torch.zeros(1, 200_000, dtype=torch.int8),
                        sw[:1], None)
