"""Which precisions a device's runtime can execute: the one question apply and launch ask.

Today the answer combines the device catalog (formats with a native path, `DeviceSpec.supports`)
with the formats this runtime emulates on that kind of device: int4 through the int8 GEMM,
fp8 as a rounded round trip around a wider GEMM, tf32 as fp32. On CPUs fp16 has neither (no
fp16 GEMM path: oneDNN runs it far slower than fp32 without AMX-FP16, docs/devices.md), so a plan asking
for it is refused rather than trained silently. The per-device implementation table built
from the kernels' dispatch code is meant to answer here later, so callers never change.
"""

from __future__ import annotations

from qsync_opt.hardware.device import DeviceSpec
from qsync_opt.precision import PRECISIONS

#: Formats the runtime executes on a device kind even without a native path, and how.
EMULATED: dict[str, dict[str, str]] = {
    "cpu": {"tf32": "as fp32", "int4": "through the int8 GEMM", "fp8_e4m3": "rounded, fp32 GEMM",
            "fp8_e5m2": "rounded, fp32 GEMM"},
    "gpu": {p: "through the torch path" for p in PRECISIONS},
}


def precision_refusal(device: DeviceSpec, precision: str) -> str | None:
    """Why `device`'s runtime cannot run `precision`, or None when it can (natively or emulated)."""
    if precision == "fp32" or device.supports(precision) or precision in EMULATED.get(device.kind, {}):
        return None
    runs = [*device.precisions, *(p for p in EMULATED.get(device.kind, {}) if p not in device.precisions)]
    return f"{precision} is not run by device {device.name}'s runtime (it runs {', '.join(runs)})"
