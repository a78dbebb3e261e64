"""Numeric formats an operator can run in, and the facts every stage needs about them.

One vocabulary for the spec, the catalog, the solver, the plan and the runtime,
so that a precision name never has to be translated between stages.
"""

from __future__ import annotations

from typing import Literal, get_args

PrecisionName = Literal["fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4"]

#: Every precision, highest first. The order is the "raise precision" direction of greedy search.
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)

#: Storage bits per element; what activations saved for backward and weight copies cost.
BITS: dict[str, int] = {
    "fp32": 32,
    "tf32": 32,  # tf32 is a tensor-core compute mode; tensors stay 32-bit in memory
    "bf16": 16,
    "fp16": 16,
    "fp8_e4m3": 8,
    "fp8_e5m2": 8,
    "int8": 8,
    "int4": 4,
}

#: Catalog throughput key for each precision (fp8 formats share one tensor-core rate).
PEAK_KEY: dict[str, str] = {
    "fp32": "fp32",
    "tf32": "tf32",
    "bf16": "bf16",
    "fp16": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "int8": "int8",
    "int4": "int4",
}

#: Explicit significand (mantissa) bits for floating formats; integer formats have none.
MANTISSA_BITS: dict[str, int] = {
    "fp32": 23,
    "tf32": 10,
    "bf16": 7,
    "fp16": 10,
    "fp8_e4m3": 3,
    "fp8_e5m2": 2,
}

INTEGER = frozenset({"int8", "int4"})


def rank(precision: str) -> int:
    """Position in PRECISIONS: 0 is the most precise."""
    return PRECISIONS.index(precision)


def sort_high_to_low(precisions) -> tuple[str, ...]:
    return tuple(sorted(set(precisions), key=rank))


def check(precision: str, where: str = "precision") -> str:
    """Return `precision` if known, else raise a ValueError that lists the known names."""
    if precision not in PRECISIONS:
        raise ValueError(f"{where}: unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    return precision
