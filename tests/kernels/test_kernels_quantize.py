"""quantize_symmetric / dequantize: exact agreement of both paths, rounding, scales, errors."""

from __future__ import annotations

import pytest
import torch

from qsync_opt.errors import SpecError
from qsync_opt.kernels import ops, reference

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (shape, axis): per tensor, per output channel of a weight, last axis, a middle axis, 1-d, odd sizes
LAYOUTS = [((257, 300), None), ((96, 515), 0), ((64, 37), 1), ((4, 5, 6, 7), 2), ((3, 70001), None), ((5,), 0),
           ((2, 3, 1), -1)]


@pytest.mark.parametrize("bits", [8, 4], ids=["int8", "int4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[1])
@pytest.mark.parametrize("shape,axis", LAYOUTS, ids=[f"{s}-ax{a}" for s, a in LAYOUTS])
def test_templated_matches_torch_exactly(cpu_module, shape, axis, dtype, bits):
    g = torch.Generator().manual_seed(hash((shape, axis)) % 2**31)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    qt, st = ops.quantize_symmetric(x, bits=bits, axis=axis, impl="templated")
    qr, sr = ops.quantize_symmetric(x, bits=bits, axis=axis, impl="torch")
    assert qt.dtype == torch.int8 and st.dtype == torch.float32
    assert torch.equal(st, sr) and torch.equal(qt, qr)
    qmax = 2 ** (bits - 1) - 1
    assert int(qt.abs().max()) == qmax  # the absmax element lands on ±qmax
    expected_scale_shape = () if axis is None else (shape[axis],)
    assert tuple(st.shape) == expected_scale_shape


def test_round_half_to_even_and_clamp(impl):
    x = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 126.5, 127.5, 300.0, -300.0])
    q, s = ops.quantize_symmetric(x, scale=torch.tensor(1.0), impl=impl)
    assert q.tolist() == [-2, -2, 0, 0, 2, 2, 126, 127, 127, -127]
    assert float(s) == 1.0
    q4, _ = ops.quantize_symmetric(x, bits=4, scale=torch.tensor(1.0), impl=impl)
    assert q4.tolist() == [-2, -2, 0, 0, 2, 2, 7, 7, 7, -7]


def test_scale_is_amax_over_qmax(impl):
    w = torch.tensor([[0.5, -2.0, 1.0], [0.0, 0.0, 0.0], [3.0, 1.0, -0.25]])
    q, s = ops.quantize_symmetric(w, axis=0, impl=impl)
    assert torch.equal(s, torch.tensor([2.0 / 127, 1.0, 3.0 / 127]))  # all-zero row -> scale 1
    assert q[1].tolist() == [0, 0, 0]
    assert q[0, 1] == -127 and q[2, 0] == 127
    qt, st = ops.quantize_symmetric(torch.zeros(10), impl=impl)
    assert float(st) == 1.0 and not qt.any()


def test_given_scale_is_used_and_returned(impl):
    x = torch.randn(40, 8)
    scale = torch.rand(8) + 0.01
    q, s = ops.quantize_symmetric(x, axis=1, scale=scale, impl=impl)
    assert torch.equal(s, scale)
    assert torch.equal(q, torch.round(x / scale).clamp(-127, 127).to(torch.int8))


@pytest.mark.parametrize("v", [2.75, -0.3, 0.5])
def test_stochastic_rounding_is_unbiased(impl, v):
    # n = 400k draws of a Bernoulli(frac) offset: std of the mean <= 0.5/sqrt(n) = 8e-4; tolerance 4e-3 (5 sigma).
    x = torch.full((400_000,), v)
    g = torch.Generator().manual_seed(1)
    q, _ = ops.quantize_symmetric(x, scale=torch.tensor(1.0), stochastic=True, generator=g, impl=impl)
    lo = torch.floor(torch.tensor(v))
    assert set(q.unique().tolist()) <= {int(lo), int(lo) + 1}  # only the two neighbours
    assert abs(q.float().mean().item() - v) < 4e-3


def test_stochastic_rounding_is_reproducible(impl):
    x = torch.randn(1000, 33)
    a, _ = ops.quantize_symmetric(x, stochastic=True, generator=torch.Generator().manual_seed(7), impl=impl)
    b, _ = ops.quantize_symmetric(x, stochastic=True, generator=torch.Generator().manual_seed(7), impl=impl)
    c, _ = ops.quantize_symmetric(x, stochastic=True, generator=torch.Generator().manual_seed(8), impl=impl)
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(3)
    d, _ = ops.quantize_symmetric(x, axis=1, stochastic=True, impl=impl)
    torch.manual_seed(3)
    e, _ = ops.quantize_symmetric(x, axis=1, stochastic=True, impl=impl)
    assert torch.equal(d, e)


def test_stochastic_noise_does_not_depend_on_thread_count(cpu_module):
    x = torch.randn(300_000)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a, _ = ops.quantize_symmetric(x, stochastic=True, generator=torch.Generator().manual_seed(5), impl="templated")
        torch.set_num_threads(2)
        b, _ = ops.quantize_symmetric(x, stochastic=True, generator=torch.Generator().manual_seed(5), impl="templated")
    finally:
        torch.set_num_threads(old)
    assert torch.equal(a, b)


def test_dequantize_per_channel():
    w = torch.randn(6, 10)
    q, s = ops.quantize_symmetric(w, axis=0, impl="torch")
    y = ops.dequantize(q, s, axis=0)
    assert torch.equal(y, q.float() * s[:, None])
    assert (y - w).abs().max() <= s.max() / 2 + 1e-7  # within half a step
    assert ops.dequantize(q, s, axis=0, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_auto_uses_templated_kernels_when_built(cpu_module):
    x = torch.randn(100, 7)
    assert ops.available("templated")
    assert torch.equal(ops.quantize_symmetric(x)[0], ops.quantize_symmetric(x, impl="templated")[0])


@pytest.mark.parametrize("kwargs,match", [
    (dict(bits=9), "bits: 9"),
    (dict(bits=1), "bits: 1"),
    (dict(axis=5), "axis: 5"),
    (dict(scale=torch.ones(3)), r"scale: got \(3,\)"),
    (dict(axis=0, scale=torch.ones(2)), r"scale: got \(2,\)"),
    (dict(scale=torch.tensor(0.0)), "scale: holds non-positive"),
    (dict(impl="fast"), "impl: unknown value 'fast'"),
])
def test_bad_arguments_name_the_field(kwargs, match):
    with pytest.raises(SpecError, match=match):
        ops.quantize_symmetric(torch.randn(4, 3), **kwargs)


def test_bad_inputs_name_the_field(cpu_module):
    with pytest.raises(SpecError, match="x: expected a floating tensor"):
        ops.quantize_symmetric(torch.ones(3, dtype=torch.int32))
    with pytest.raises(SpecError, match="impl='templated'.*float64"):
        ops.quantize_symmetric(torch.randn(3, dtype=torch.float64), impl="templated")
    q, s = ops.quantize_symmetric(torch.randn(3, dtype=torch.float64))  # auto: torch path
    assert q.dtype == torch.int8
    with pytest.raises(SpecError, match="q: expected an int8 tensor"):
        ops.dequantize(torch.ones(3), torch.tensor(1.0))


_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("qmax", [127.0, 7.0, 448.0, 57344.0])
def test_reference_scale_is_the_correctly_rounded_quotient_on_every_device(device, qmax):
    """The reference's scale is amax / qmax rounded once to fp32, as the CPU and CUDA kernels divide
    (float64 division rounded to fp32 is the correctly rounded fp32 quotient). On the H200, torch's
    `tensor / python_float` multiplied by the rounded reciprocal and the references' scales came out
    1 ulp off the kernels'."""
    amax = (torch.rand(200_000, generator=torch.Generator().manual_seed(0)) * 50 + 1e-3).to(device)
    want = (amax.double() / qmax).float()
    assert torch.equal(reference.scale_from_amax(amax, qmax), want)
    assert torch.equal(reference.scale_from_amax(torch.zeros(3, device=device), qmax), torch.ones(3, device=device))
