"""What identifies this machine's kernels, and where its measured profiles live (no torch import).

Both profilers (training's per-operator costs, serving's per-layer costs) key their caches by the
CPU model and the ISA flags that select kernels, and keep them in one folder.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_fp16")
"""CPU flags that change which kernels run (AMX, AVX-512 variants, VNNI)."""


def cpu_description() -> dict:
    """{'cpu': the CPU's model name, 'isa': the ISA_FLAGS it has, sorted}."""
    cpu, flags = platform.processor() or platform.machine(), set()
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
    return {"cpu": cpu, "isa": sorted(f for f in ISA_FLAGS if f in flags)}


def profile_dir() -> Path:
    """$QSYNC_OPT_PROFILE_DIR, else $QSYNC_OPT_CACHE, else ~/.cache/qsync_opt/profiles."""
    root = os.environ.get("QSYNC_OPT_PROFILE_DIR") or os.environ.get("QSYNC_OPT_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "qsync_opt" / "profiles"
