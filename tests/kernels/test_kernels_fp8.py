"""fp8_roundtrip: equal to torch's own float8 casts, scaled to the format's range, saturating."""

from __future__ import annotations

import pytest
import torch

from qsync_opt.errors import SpecError
from qsync_opt.kernels import ops

FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0, 3), "e5m2": (torch.float8_e5m2, 57344.0, 2)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_equals_torch_cast_at_unit_scale(fmt):
    dtype, fmax, _ = FORMATS[fmt]
    x = torch.randn(10_000) * fmax / 8
    y, s = ops.fp8_roundtrip(x, fmt, scale=torch.tensor(1.0))
    assert torch.equal(y, x.to(dtype).float()) and float(s) == 1.0


@pytest.mark.parametrize("fmt", FORMATS)
def test_computed_scale_maps_amax_to_format_max(fmt):
    dtype, fmax, mbits = FORMATS[fmt]
    x = torch.randn(4096, dtype=torch.bfloat16) * 3
    y, s = ops.fp8_roundtrip(x, fmt)
    amax = x.float().abs().max()
    assert torch.equal(s, amax / fmax)
    assert torch.equal(y, (x.float() / s).to(dtype).float() * s)  # the documented emulation, exactly
    normal = x.float().abs() > amax * 2**-6  # away from the subnormal range the error is relative
    rel = ((y - x.float()).abs() / x.float().abs())[normal]
    assert rel.max() <= 2 ** -(mbits + 1) + 1e-6  # round to nearest: half an ulp


@pytest.mark.parametrize("fmt", FORMATS)
def test_out_of_range_values_saturate(fmt):
    _, fmax, _ = FORMATS[fmt]
    y, _ = ops.fp8_roundtrip(torch.tensor([1e9, -1e9, 1.0]), fmt, scale=torch.tensor(1.0))
    assert y.tolist() == [fmax, -fmax, 1.0]


def test_zero_tensor_gets_unit_scale():
    y, s = ops.fp8_roundtrip(torch.zeros(5), "e4m3")
    assert float(s) == 1.0 and not y.any()


def test_bad_arguments_name_the_field():
    with pytest.raises(SpecError, match="fmt: unknown fp8 format 'e3m4'"):
        ops.fp8_roundtrip(torch.randn(3), "e3m4")
    with pytest.raises(SpecError, match="scale: shape"):
        ops.fp8_roundtrip(torch.randn(3, 4), "e4m3", scale=torch.ones(5))
    with pytest.raises(SpecError, match="scale: holds non-positive"):
        ops.fp8_roundtrip(torch.randn(3), "e4m3", scale=torch.tensor(-1.0))
