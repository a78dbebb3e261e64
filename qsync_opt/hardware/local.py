"""A DeviceSpec for the CPU this process runs on, measured in a few seconds.

The catalog's `cpu-local` entry holds the figures measured once on the development machine;
this module re-measures them wherever the package runs (a scheduler's node, a laptop), so a
CPU group can be planned with its own numbers. Measured: copy bandwidth (read + write) of a
64 MiB tensor, and square-GEMM throughput for fp32, bf16, fp16 (torch.matmul) and int8
(torch._int_mm). A format is kept when it reaches at least 5% of the fp32 rate (fp16 without
AMX-FP16 under an AVX512_CORE_BF16 cap collapses to ~1%: no usable path). Medians of repeats;
the CPU's own run-to-run spread (±20-40% for 2-thread int8) is not hidden by this.
"""

from __future__ import annotations

import time

import torch

from .device import DeviceSpec

#: Square-GEMM peaks are optimistic for training shapes (smaller, transposed in backward).
MEASURED_EFFICIENCY = 0.7
MIN_FRACTION_OF_FP32 = 0.05


def _median_s(fn, repeats: int) -> float:
    fn()  # warm-up: first-touch allocation, kernel selection
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def measure_bandwidth_gbs(mib: int = 64, repeats: int = 5) -> float:
    """Copy bandwidth, bytes read + written, GB/s."""
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _median_s(lambda: dst.copy_(src), repeats) / 1e9


def measure_gemm_tflops(dtype: torch.dtype, n: int = 1024, repeats: int = 3) -> float | None:
    """n³ GEMM throughput in TFLOP/s (TOP/s for int8); None if the format does not run here."""
    try:
        if dtype == torch.int8:
            a = torch.randint(-8, 8, (n, n), dtype=torch.int8)
            b = torch.randint(-8, 8, (n, n), dtype=torch.int8)
            fn = lambda: torch._int_mm(a, b)  # noqa: E731
        else:
            a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
            fn = lambda: torch.matmul(a, b)  # noqa: E731
        return 2 * n**3 / _median_s(fn, repeats) / 1e12
    except (RuntimeError, NotImplementedError):
        return None


def measure_launch_us(repeats: int = 200) -> float:
    x = torch.ones(16)
    return _median_s(lambda: torch.relu(x), repeats) * 1e6


def measure_local(name: str = "cpu-measured", *, n: int = 1024, memory_gb: float | None = None) -> DeviceSpec:
    """Measure this CPU and return it as a DeviceSpec (kind 'cpu'); a few seconds at n = 1024."""
    rates = {
        "fp32": measure_gemm_tflops(torch.float32, n),
        "bf16": measure_gemm_tflops(torch.bfloat16, n),
        "fp16": measure_gemm_tflops(torch.float16, n),
        "int8": measure_gemm_tflops(torch.int8, n),
    }
    fp32 = rates["fp32"]
    peaks = {k: round(v, 4) for k, v in rates.items() if v and v >= MIN_FRACTION_OF_FP32 * fp32}
    if memory_gb is None:
        memory_gb = _total_memory_gb()
    return DeviceSpec(
        name=name,
        kind="cpu",
        memory_gb=memory_gb,
        bandwidth_gbs=round(measure_bandwidth_gbs(), 2),
        peak_tflops=peaks,
        efficiency={k: MEASURED_EFFICIENCY for k in peaks},
        bandwidth_efficiency=0.5,
        launch_overhead_us=round(max(measure_launch_us(), 1.0), 2),
        source=f"measured by qsync_opt.hardware.local with {torch.get_num_threads()} threads, n={n}",
    )


def _total_memory_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return 8.0
