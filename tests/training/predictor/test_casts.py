"""Cast cost model: t = a·n + b, derived from bandwidth or taken from QSync's T4 fits."""

from __future__ import annotations

import pytest

from qsync_opt.errors import SpecError
from qsync_opt.hardware.device import find_device
from qsync_opt.training.predictor.casts import (
    activation_format, cast_fit, cast_ms, edge_cast_ms, edge_cast_parts, resolve_backward_precision,
)

A100, T4 = find_device("A100-40GB"), find_device("T4")
N = 1_000_000


def test_bandwidth_cast_by_hand():
    # A100-40GB: 1555 GB/s x 0.8 = 1.244e9 bytes/ms; fp32 -> bf16 moves 4 + 2 bytes per element.
    expected = 6 * N / 1.244e9 + 5e-3
    assert cast_ms(N, "fp32", "bf16", A100) == pytest.approx(expected, rel=1e-12)


def test_int8_cast_adds_an_absmax_read_and_a_launch():
    # fp16 -> int8: read 2 (absmax) + read 2 + write 1 bytes per element, two launches.
    expected = 5 * N / 1.244e9 + 2 * 5e-3
    assert cast_ms(N, "fp16", "int8", A100) == pytest.approx(expected, rel=1e-12)
    assert cast_ms(N, "fp16", "int8", A100) > cast_ms(N, "fp16", "bf16", A100)


def test_t4_uses_the_published_fits():
    assert cast_ms(N, "fp32", "int8", T4) == pytest.approx(1.42e-7 * N + 1.22e-2)
    assert cast_ms(N, "fp32", "fp16", T4) == pytest.approx(2.88e-8 * N + 1.0e-3)
    assert cast_fit("fp16", "int4", T4).source == "published:T4"  # int4 rides on int8's kernels
    assert cast_ms(10, "int8", "fp32", T4) == 0.0  # negative intercept clamped


def test_same_storage_costs_nothing():
    assert cast_ms(N, "bf16", "bf16", A100) == 0.0
    assert cast_ms(N, "fp32", "tf32", A100) == 0.0  # both stored as 32-bit floats
    assert cast_ms(0, "fp32", "bf16", A100) == 0.0


def test_edge_cast_is_forward_activation_plus_backward_gradient():
    f, b = edge_cast_parts(N, "fp32", "bf16", A100)
    assert f == pytest.approx(cast_ms(N, "fp32", "bf16", A100))
    assert b == pytest.approx(cast_ms(N, "bf16", "fp32", A100))
    assert edge_cast_ms(N, "fp32", "bf16", A100) == pytest.approx(f + b)
    # T4 by hand from the published fp32 <-> fp16 fit, both directions:
    assert edge_cast_ms(N, "fp32", "fp16", T4) == pytest.approx(2 * (2.88e-8 * N + 1.0e-3))


@pytest.mark.parametrize("pa, pb", [("fp32", "fp32"), ("fp32", "tf32"), ("int8", "int8"), ("int8", "int4"),
                                     ("int8", "bf16"), ("fp8_e4m3", "int8")])
def test_edges_without_a_format_change_are_free(pa, pb):
    # int/fp8 ops hand on (and take) activations in the backward precision, here bf16.
    assert edge_cast_ms(N, pa, pb, A100, "bf16") == 0.0


def test_int8_next_to_fp32_pays_the_16_bit_conversion():
    assert edge_cast_ms(N, "fp32", "int8", A100, "bf16") == pytest.approx(edge_cast_ms(N, "fp32", "bf16", A100))


def test_fp32_boundary_has_no_edge_casts():
    assert edge_cast_ms(N, "fp32", "bf16", A100, boundary="fp32") == 0.0


def test_backward_precision_falls_back_to_what_the_device_runs():
    assert resolve_backward_precision("bf16", T4) == "fp16"  # Turing has no bf16
    assert resolve_backward_precision("fp16", find_device("cpu-local")) == "bf16"
    assert resolve_backward_precision("bf16", A100) == "bf16"
    assert resolve_backward_precision("fp32", A100) == "fp32"
    assert activation_format("int8", "fp16") == "fp16" and activation_format("tf32", "bf16") == "fp32"


def test_unknown_precision_names_the_field_and_the_choices():
    with pytest.raises(SpecError, match=r"cast dst: unknown precision 'int3'.*int8"):
        cast_ms(N, "fp32", "int3", A100)
