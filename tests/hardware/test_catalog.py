"""The built-in device catalog: complete entries, positive numbers, formats as the datasheets say."""

from __future__ import annotations

import pytest

from qsync_opt.hardware.device import catalog, find_device

EXPECTED = {
    "T4", "V100-16GB", "V100-32GB", "P100", "A100-40GB", "A100-80GB", "A10", "A30", "L4",
    "H100-SXM", "H200", "cpu-local", "cpu-noamx", "cpu-sse41",
}
NAMES = sorted(catalog())


def test_every_expected_device_is_there():
    assert EXPECTED <= set(catalog())


@pytest.mark.parametrize("name", NAMES)
def test_entry_is_complete_and_positive(name):
    d = catalog()[name]
    assert d.memory_gb > 0 and d.bandwidth_gbs > 0 and d.launch_overhead_us > 0
    assert d.source, f"{name}: every entry names where its numbers come from"
    assert set(d.efficiency) == set(d.peak_tflops), f"{name}: an efficiency for every format it runs"
    assert all(0.1 <= e <= 0.9 for e in d.efficiency.values())
    assert all(v > 0 for v in d.peak_tflops.values())
    if d.kind == "gpu":
        assert d.sm is not None and 60 <= d.sm <= 90
    else:
        assert d.sm is None


@pytest.mark.parametrize(
    "name, has, lacks",
    [
        ("T4", {"fp16", "int8", "int4"}, {"bf16", "tf32", "fp8_e4m3"}),
        ("V100-16GB", {"fp16", "int8"}, {"bf16", "tf32", "int4"}),
        ("V100-32GB", {"fp16", "int8"}, {"bf16", "tf32", "int4"}),
        ("P100", {"fp16"}, {"bf16", "int8"}),
        ("A100-40GB", {"tf32", "bf16", "fp16", "int8", "int4"}, {"fp8_e4m3"}),
        ("A10", {"tf32", "bf16", "int8", "int4"}, {"fp8_e4m3"}),
        ("L4", {"bf16", "fp8_e4m3", "fp8_e5m2", "int8"}, {"int4"}),
        ("H100-SXM", {"bf16", "fp8_e4m3", "fp8_e5m2", "int8"}, {"int4"}),
        ("H200", {"bf16", "fp8_e4m3", "int8"}, {"int4"}),
        ("cpu-local", {"bf16", "int8"}, {"fp16", "tf32"}),
        ("cpu-noamx", {"bf16", "int8"}, {"fp16", "tf32"}),
        ("cpu-sse41", {"bf16", "int8"}, {"fp16", "tf32"}),
    ],
)
def test_supported_precisions_follow_the_datasheets(name, has, lacks):
    d = catalog()[name]
    assert "fp32" in d.precisions
    assert has <= set(d.precisions)
    assert not (lacks & set(d.precisions))


@pytest.mark.parametrize(
    "name, key, value",
    [("T4", "fp16", 65), ("T4", "int4", 260), ("A100-80GB", "bf16", 312), ("H100-SXM", "fp8", 1979),
     ("L4", "fp8", 242), ("A30", "int4", 661), ("V100-32GB", "int8", 62)],
)
def test_dense_peaks_match_the_reference_table(name, key, value):
    assert catalog()[name].peak_tflops[key] == value


def test_memory_and_bandwidth_match_the_reference_table():
    c = catalog()
    assert (c["A100-40GB"].bandwidth_gbs, c["A100-80GB"].bandwidth_gbs) == (1555, 2039)
    assert (c["H200"].memory_gb, c["H200"].bandwidth_gbs) == (141, 4800)
    assert c["V100-32GB"].memory_gb == 32 and c["V100-16GB"].memory_gb == 16


def test_t4_int8_is_less_efficient_than_its_fp16():
    t4 = catalog()["T4"]
    assert t4.achieved_flops("int8") < 1.2 * t4.achieved_flops("fp16")


def test_cpu_entries_are_the_same_chip_with_and_without_amx():
    amx, noamx = catalog()["cpu-local"], catalog()["cpu-noamx"]
    assert amx.peak_tflops["fp32"] == noamx.peak_tflops["fp32"]
    assert noamx.achieved_flops("bf16") < amx.achieved_flops("fp32") < amx.achieved_flops("bf16")
    assert noamx.achieved_flops("int8") < amx.achieved_flops("int8")


def test_cpu_sse41_prices_low_precision_below_fp32_as_measured_without_native_bf16_or_int8():
    """Without AVX-512-BF16/VNNI/AMX (the SSE4.1 cap) bf16 and int8 run far slower than fp32:
    a roofline plan for this device must never prefer them."""
    d = catalog()["cpu-sse41"]
    assert d.kind == "cpu" and "SSE41" in d.source
    assert d.achieved_flops("bf16") < d.achieved_flops("fp32") / 10
    assert d.achieved_flops("int8") < d.achieved_flops("fp32") / 10


def test_find_device_is_forgiving_and_lists_names_on_a_miss():
    assert find_device("h100_sxm").name == "H100-SXM"
    with pytest.raises(KeyError, match="T4"):
        find_device("T5")


def test_measured_local_cpu_is_a_valid_device():
    from qsync_opt.hardware.local import measure_local

    d = measure_local(n=256)
    assert d.kind == "cpu" and d.memory_gb > 0 and d.bandwidth_gbs > 0
    assert "fp32" in d.precisions and d.launch_overhead_us >= 1.0
    assert set(d.efficiency) == set(d.peak_tflops)
    assert "measured" in d.source


def test_a_capped_cpu_is_re_measured_in_a_process_carrying_the_cap():
    """The ISA cap is read once per process, so it is measured in a fresh one; the entry says so."""
    from qsync_opt.hardware.local import measure_local_env

    d = measure_local_env({"ONEDNN_MAX_CPU_ISA": "SSE41"}, "cpu-sse41-here", n=128, threads=1)
    assert d.name == "cpu-sse41-here" and d.kind == "cpu" and "fp32" in d.precisions
    assert d.source.endswith("env ONEDNN_MAX_CPU_ISA=SSE41") and "with 1 threads" in d.source
