"""A DeviceSpec for the CPU this process runs on, measured in a few seconds.

The catalog's CPU entries hold figures measured once: `cpu-local` on an AVX-512/AMX
development machine, `cpu-sse41` on an AVX2-only EPYC under ONEDNN_MAX_CPU_ISA=SSE41. This
module re-measures them wherever the package runs (a scheduler's node, a laptop), so a CPU
group can be planned with its own numbers; `measure_local_env` does it under a group's env
(in a subprocess, since oneDNN reads its ISA cap once, at its first kernel), and
`python -m qsync_opt.hardware.local [--env K=V ...] [--threads N]` prints the result as a
catalog entry. Measured: copy bandwidth (read + write) of a 64 MiB tensor, and square-GEMM
throughput for fp32, bf16, fp16 (torch.matmul) and int8 (the runtime's exact int8 GEMM,
kernels.reference.int_mm_exact: torch._int_mm with VNNI, fp32 GEMMs on the codes without it).
A format is kept when it reaches at least MIN_FRACTION_OF_FP32 of the fp32 rate (fp16 without
AMX-FP16 under an AVX512_CORE_BF16 cap collapses to ~1%: no usable path; on an AVX2-only CPU
bf16 runs at 2% of fp32 and is dropped, and int8 runs as fp32 GEMMs on its codes, at about
the fp32 rate). Medians of repeats; the CPU's own run-to-run spread
(±20-40% for 2-thread int8) is not hidden by this.
"""

from __future__ import annotations

import time

import torch

from qsync_opt.hardware.device import DeviceSpec
from qsync_opt.kernels.reference import int_mm_exact

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
            fn = lambda: int_mm_exact(a, b)  # noqa: E731  (what the runtime runs: _int_mm where exact, else fp32 slices)
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


def measure_local_env(env: dict[str, str], name: str = "cpu-measured", *, n: int = 1024,
                      threads: int | None = None) -> DeviceSpec:
    """measure_local in a fresh process carrying `env` (e.g. {"ONEDNN_MAX_CPU_ISA": "SSE41"})."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    argv = [sys.executable, "-m", "qsync_opt.hardware.local", "--json", "--name", name, "--n", str(n)]
    if threads:
        argv += ["--threads", str(threads)]
    root = str(Path(__file__).resolve().parents[2])
    penv = {**os.environ, **env, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(argv, env=penv, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"measuring this CPU under env {env} failed: {r.stderr[-1000:]}")
    d = DeviceSpec(**json.loads(r.stdout))
    caps = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
    return d.model_copy(update={"source": f"{d.source}, env {caps}" if caps else d.source})


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import os

    import yaml

    ap = argparse.ArgumentParser(description="Measure this CPU as a catalog entry.")
    ap.add_argument("--name", default="cpu-measured")
    ap.add_argument("--n", type=int, default=1024, help="GEMM size")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="measure under this env (repeatable)")
    ap.add_argument("--json", action="store_true", help="print the DeviceSpec as JSON")
    a = ap.parse_args(argv)
    env = dict(kv.split("=", 1) for kv in a.env)
    if env:
        d = measure_local_env(env, a.name, n=a.n, threads=a.threads)
    else:
        if a.threads:
            torch.set_num_threads(a.threads)
        d = measure_local(a.name, n=a.n)
    data = d.model_dump(exclude_none=True)
    if a.json:
        print(json.dumps(data))
    else:
        print(yaml.safe_dump({data.pop("name"): data}, sort_keys=False), end="")
        print(f"# load {os.getloadavg()}")
    return 0


def _total_memory_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return 8.0


if __name__ == "__main__":
    raise SystemExit(main())
