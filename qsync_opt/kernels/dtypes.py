"""Explicit maps between dtype names, torch dtypes, C++ types and CUDA types.

Spelled out once (as flashinfer's jit does) so that a rendered kernel never guesses a type
from a string, and an unknown dtype fails with the list of known ones.
"""

from __future__ import annotations

import torch

from qsync_opt.errors import SpecError

#: Floating input dtypes a quantize kernel can read.
TORCH_DTYPE: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

#: Output dtypes of the dequantising epilogue.
OUT_DTYPES: tuple[str, ...] = ("fp32", "bf16")

CPU_CTYPE: dict[str, str] = {"fp32": "float", "bf16": "c10::BFloat16", "fp16": "c10::Half"}
CUDA_CTYPE: dict[str, str] = {"fp32": "float", "bf16": "__nv_bfloat16", "fp16": "__half"}

#: fp8 formats: torch dtype, largest finite value, CUDA storage type and PTX name.
FP8: dict[str, dict] = {
    "e4m3": {"torch": torch.float8_e4m3fn, "max": 448.0, "cuda": "__nv_fp8_e4m3", "ptx": "e4m3"},
    "e5m2": {"torch": torch.float8_e5m2, "max": 57344.0, "cuda": "__nv_fp8_e5m2", "ptx": "e5m2"},
}


def name_of(dtype: torch.dtype, field: str = "dtype") -> str:
    """Short name ('fp32', 'bf16', 'fp16') of a torch floating dtype."""
    for name, dt in TORCH_DTYPE.items():
        if dt == dtype:
            return name
    raise SpecError(f"{field}: unsupported dtype {dtype}; use one of {', '.join(map(str, TORCH_DTYPE.values()))}")


def check_names(names, allowed, field: str) -> tuple[str, ...]:
    """Validate a non-empty tuple of dtype names against `allowed`; keep the caller's order, drop repeats."""
    names = tuple(dict.fromkeys(names))
    if not names:
        raise SpecError(f"{field}: empty; list at least one of {', '.join(allowed)}")
    bad = [n for n in names if n not in allowed]
    if bad:
        raise SpecError(f"{field}: unknown dtype name(s) {bad}; known: {', '.join(allowed)}")
    return names
