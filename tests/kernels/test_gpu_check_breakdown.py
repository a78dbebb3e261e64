"""gpu_check's breakdown step attributes device time as a GPU profile reports it: each kernel once, to the innermost
qsync range that launched it, and a range's GPU-side annotation (which kineto may link to it like a kernel) never.
Checked on a scripted profile (the GPU branch cannot run here); the CPU branch runs in test_gpu_check.py."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from torch.autograd.profiler_util import Kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_check_breakdown as breakdown  # noqa: E402

CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


def op(name, kernels=(), children=()):
    return types.SimpleNamespace(name=name, device_type=CPU, kernels=[Kernel(k, 0, us) for k, us in kernels],
                                 cpu_children=list(children), is_user_annotation=name.startswith("qsync::"))


def kernel(name, us, annotation=False):
    return types.SimpleNamespace(name=name, device_type=CUDA, kernels=[], cpu_children=[],
                                 is_user_annotation=annotation,
                                 time_range=types.SimpleNamespace(elapsed_us=lambda: us))


def test_device_time_goes_to_the_innermost_range_once():
    # backward[...] holds quantize[grad] (one kernel) and two GEMMs; gemm[...] in the forward; a bias-gradient sum
    # outside every range; each range's GPU annotation is linked to it as a "kernel" named like the range
    quant = op("qsync::quantize[grad->fp8_e5m2]", [("qsync::quantize[grad->fp8_e5m2]", 31.0)],
               [op("aten::div", [("cast_kernel", 30.0)])])
    bwd = op("qsync::backward[fp8_e4m3@fp8]", [("qsync::backward[fp8_e4m3@fp8]", 500.0)],
             [quant, op("aten::_scaled_mm", [("sm90_gemm", 200.0)]), op("aten::_scaled_mm", [("sm90_gemm", 210.0)])])
    fwd = op("qsync::gemm[fp8_e4m3]", [], [op("aten::_scaled_mm", [("sm90_gemm", 100.0)])])
    outside = op("aten::sum", [("reduce_kernel", 20.0)])
    events = [bwd, *bwd.cpu_children, *quant.cpu_children, fwd, *fwd.cpu_children, outside,
              kernel("sm90_gemm", 510.0), kernel("cast_kernel", 30.0), kernel("reduce_kernel", 20.0),
              kernel("qsync::backward[fp8_e4m3@fp8]", 500.0, annotation=True)]
    rows = {(r["kind"], r["name"]): r for r in breakdown.attribute(events, steps=2, gpu=True)}
    assert rows[("total", "all")]["ms"] == pytest.approx(560.0 / 1e3 / 2)  # 100 + 200 + 210 + 30 + 20 us, per step
    assert rows[("range", "backward[fp8_e4m3@fp8]")]["ms"] == pytest.approx(410.0 / 2e3)  # its GEMMs, not the quantize
    assert rows[("range", "quantize[grad->fp8_e5m2]")]["ms"] == pytest.approx(30.0 / 2e3)
    assert rows[("range", "gemm[fp8_e4m3]")]["ms"] == pytest.approx(100.0 / 2e3)
    assert rows[("outside", "outside every qsync range")]["ms"] == pytest.approx(20.0 / 2e3)
    assert sum(r["share"] for r in rows.values() if r["kind"] in ("range", "outside")) == pytest.approx(1.0)
    kernels = [r["name"] for r in breakdown.attribute(events, steps=2, gpu=True) if r["kind"] == "kernel"]
    assert kernels == ["sm90_gemm", "cast_kernel", "reduce_kernel"]  # busiest first; no annotation among them
