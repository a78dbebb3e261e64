"""What identifies this machine's kernels, and where its measured profiles live (no torch import).

Both profilers (training's per-operator costs, serving's per-layer costs) key their caches by the
CPU model and the ISA flags that select kernels, and keep them in one folder.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_fp16")
"""CPU flags that change which kernels run (AMX, AVX-512 variants, VNNI)."""


def cpu_description() -> dict:
    """{'cpu': the CPU's model name, 'isa': the ISA_FLAGS it has, sorted}."""
    cpu, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    cpu = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    if cpu is None:  # platform.processor() runs `uname -p` on Linux: only where /proc/cpuinfo has no model name
        cpu = platform.processor() or platform.machine()
    return {"cpu": cpu, "isa": sorted(f for f in ISA_FLAGS if f in flags)}


DRIVER_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd")
"""What a GPU driver leaves on Linux: NVIDIA's control and first device node, its /proc folder, and the ROCm
kernel driver's node (a ROCm build of torch answers torch.cuda too)."""


def cuda_possible(files: tuple[str, ...] = DRIVER_FILES) -> bool:
    """False only where torch.cuda.is_available() is False for certain: Linux without any GPU driver's files. True
    elsewhere (the caller asks torch), so that a CPU machine can describe itself without importing torch (a second
    or more: `qsync-opt profile`'s parent, before it starts the measuring processes)."""
    if sys.platform != "linux":
        return True
    return any(os.path.exists(f) for f in files)


def profile_dir() -> Path:
    """$QSYNC_OPT_PROFILE_DIR, else $QSYNC_OPT_CACHE, else ~/.cache/qsync_opt/profiles."""
    root = os.environ.get("QSYNC_OPT_PROFILE_DIR") or os.environ.get("QSYNC_OPT_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "qsync_opt" / "profiles"
