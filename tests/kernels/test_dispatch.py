"""The table of what runs where: every (catalog architecture, precision) pair, and the planner reading it."""

from __future__ import annotations

import pytest

from qsync_opt.errors import SpecError
from qsync_opt.hardware.device import DeviceSpec, catalog, find_device
from qsync_opt.hardware.device import catalog_table
from qsync_opt.kernels.dispatch import (Target, format_table, gemm_impl, implementation, offer,
                                        storage_bits)
from qsync_opt.precision import PRECISIONS

# target -> precision -> (kind, op) under kernels='auto'. Written out by hand: this is the contract.
LIB, TPL, EMU = "library", "templated", "emulation"
FP8_EMU = (EMU, "torch.matmul fp32 on fp8-rounded values")
EXPECTED = {
    "sm_60": {"fp32": (LIB, "torch.matmul"), "tf32": (EMU, "torch.matmul"), "bf16": (LIB, "torch.matmul"),
              "fp16": (LIB, "torch.matmul"), "fp8_e4m3": FP8_EMU, "fp8_e5m2": FP8_EMU,
              "int8": (LIB, "torch._int_mm"), "int4": (EMU, "torch._int_mm on ±7 codes")},
    "sm_70": {"fp32": (LIB, "torch.matmul"), "tf32": (EMU, "torch.matmul"), "bf16": (LIB, "torch.matmul"),
              "fp16": (LIB, "torch.matmul"), "fp8_e4m3": FP8_EMU, "fp8_e5m2": FP8_EMU,
              "int8": (LIB, "torch._int_mm"), "int4": (EMU, "torch._int_mm on ±7 codes")},
    "sm_75": {"fp32": (LIB, "torch.matmul"), "tf32": (EMU, "torch.matmul"), "bf16": (LIB, "torch.matmul"),
              "fp16": (LIB, "torch.matmul"), "fp8_e4m3": FP8_EMU, "fp8_e5m2": FP8_EMU,
              "int8": (LIB, "torch._int_mm"), "int4": (TPL, "qsync.cuda.int4_wmma")},
    "sm_80": {"fp32": (LIB, "torch.matmul"), "tf32": (LIB, "torch.matmul"), "bf16": (LIB, "torch.matmul"),
              "fp16": (LIB, "torch.matmul"), "fp8_e4m3": FP8_EMU, "fp8_e5m2": FP8_EMU,
              "int8": (LIB, "torch._int_mm"), "int4": (TPL, "qsync.cuda.int4_wmma")},
    "sm_86": {"fp32": (LIB, "torch.matmul"), "tf32": (LIB, "torch.matmul"), "bf16": (LIB, "torch.matmul"),
              "fp16": (LIB, "torch.matmul"), "fp8_e4m3": FP8_EMU, "fp8_e5m2": FP8_EMU,
              "int8": (LIB, "torch._int_mm"), "int4": (TPL, "qsync.cuda.int4_wmma")},
    "sm_89": {"fp32": (LIB, "torch.matmul"), "tf32": (LIB, "torch.matmul"), "bf16": (LIB, "torch.matmul"),
              "fp16": (LIB, "torch.matmul"), "fp8_e4m3": (LIB, "torch._scaled_mm"),
              "fp8_e5m2": (TPL, "qsync.cuda.fp8_mma"), "int8": (LIB, "torch._int_mm"),
              "int4": (TPL, "qsync.cuda.int4_wmma")},
    "sm_90": {"fp32": (LIB, "torch.matmul"), "tf32": (LIB, "torch.matmul"), "bf16": (LIB, "torch.matmul"),
              "fp16": (LIB, "torch.matmul"), "fp8_e4m3": (LIB, "torch._scaled_mm"),
              "fp8_e5m2": (TPL, "qsync.cuda.fp8_mma"), "int8": (LIB, "torch._int_mm"),
              "int4": (EMU, "torch._int_mm on ±7 codes")},
    "cpu": {"fp32": (LIB, "torch.matmul"), "tf32": (EMU, "torch.matmul"), "bf16": (LIB, "torch.matmul"),
            "fp16": (LIB, "torch.matmul"), "fp8_e4m3": FP8_EMU, "fp8_e5m2": FP8_EMU,
            "int8": (TPL, "qsync.cpu.int8_linear"), "int4": (EMU, "qsync.cpu.int8_linear on ±7 codes")},
}
PAIRS = [(name, p) for name in catalog() for p in PRECISIONS]


@pytest.mark.parametrize("name,precision", PAIRS, ids=[f"{n}-{p}" for n, p in PAIRS])
def test_every_catalog_pair_maps_to_its_implementation(name, precision):
    dev = find_device(name)
    impl = implementation(dev, precision)
    assert (impl.kind, impl.op) == EXPECTED[Target.of_device_spec(dev).label][precision]
    ok, why = offer(dev, precision)
    # offered exactly when the datasheet lists the format and it is not fp32 arithmetic in disguise
    listed = precision.split("_")[0] in dev.peak_tflops or precision in dev.peak_tflops
    assert ok == (listed and impl.via != "fp32"), why
    assert ok == (precision in dev.precisions)
    if ok:  # priced at the rate of what runs, which the device lists
        assert impl.rate in dev.peak_tflops


def test_the_issue_examples():
    t4, v100, h100 = find_device("T4"), find_device("V100-32GB"), find_device("H100-SXM")
    assert implementation(t4, "int4").op == "qsync.cuda.int4_wmma" and "int4" in t4.precisions
    assert "fp8_e4m3" not in v100.precisions and "fp8_e5m2" not in v100.precisions
    assert offer(v100, "fp8_e4m3") == (False, "V100-32GB lists no fp8 rate")
    assert implementation(h100, "fp8_e4m3").op == "torch._scaled_mm"  # cuBLASLt on fp8 tensor cores
    assert implementation(h100, "fp8_e5m2").op == "qsync.cuda.fp8_mma"  # mma.sync e5m2 (cuBLASLt refuses e5m2 x e5m2)
    assert implementation(h100, "fp8_e4m3").rate == "fp8"


def test_emulated_formats_are_priced_at_the_arithmetic_that_runs():
    # A custom Hopper-class device whose datasheet lists int4: int4 runs through the int8 path.
    dev = DeviceSpec(name="custom-sm90", memory_gb=80, bandwidth_gbs=3000, sm=90,
                     peak_tflops={"fp32": 60, "int8": 1000, "int4": 2000, "fp8": 1000})
    assert implementation(dev, "int4").via == "int8" and dev.rate_key("int4") == "int8"
    assert dev.achieved_flops("int4") == dev.achieved_flops("int8")
    # and an fp8 rate without fp8 units (no sm given) is not offered: it would be fp32 arithmetic
    no_sm = dev.model_copy(update={"sm": None, "name": "custom"})
    assert "fp8_e4m3" not in no_sm.precisions and offer(no_sm, "fp8_e4m3")[1].startswith("runs as torch.matmul fp32")


def test_kernels_setting_changes_the_choice():
    t75, t90 = Target("cuda", 75), Target("cuda", 90)
    assert gemm_impl(t75, "int8", "templated").op == "qsync.cuda.int8_wmma"
    assert gemm_impl(t75, "int4", "torch").op == "torch._int_mm on ±7 codes"
    assert gemm_impl(t90, "fp8_e4m3", "templated").op == "qsync.cuda.fp8_mma"
    assert gemm_impl(t90, "fp8_e5m2", "torch").kind == "emulation"
    assert gemm_impl(Target("cpu"), "int8", "torch").op == "torch._int_mm"
    with pytest.raises(SpecError, match="kernels='templated': no templated int8 GEMM for sm_70"):
        gemm_impl(Target("cuda", 70), "int8", "templated")
    with pytest.raises(SpecError, match="kernels: unknown value 'fast'"):
        gemm_impl(t75, "int8", "fast")


def test_storage_bits_are_the_runtime_dtypes():
    assert {p: storage_bits(p) for p in PRECISIONS} == {
        "fp32": 32, "tf32": 32, "bf16": 16, "fp16": 16, "fp8_e4m3": 8, "fp8_e5m2": 8, "int8": 8, "int4": 8}


def test_table_prints_every_row():
    rows = catalog_table()
    assert len(rows) == len(catalog()) * len(PRECISIONS)
    text = format_table(rows)
    assert "T4         sm_75   int4       templated: qsync.cuda.int4_wmma" in text
    assert len(text.splitlines()) == len(rows) + 2
