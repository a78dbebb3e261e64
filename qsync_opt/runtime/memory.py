"""Usable device memory under this runtime: what a plan may fill once the framework has taken its share."""

from __future__ import annotations

#: Bytes of usable memory a device loses to the framework (CUDA context, allocator slack).
RUNTIME_OVERHEAD_BYTES = {"gpu": 0.5e9, "cpu": 0.5e9}
#: Fraction of device memory the planner lets a plan use (LLM-PQ uses the same 0.95).
USABLE_FRACTION = 0.95


def capacity_bytes(memory_bytes: float, kind: str = "gpu") -> float:
    """Usable bytes of a device with `memory_bytes`: 95% of it less the runtime's overhead."""
    return memory_bytes * USABLE_FRACTION - RUNTIME_OVERHEAD_BYTES.get(kind, 0.5e9)
