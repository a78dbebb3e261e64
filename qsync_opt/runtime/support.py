"""Which precisions a device's runtime can execute: the one question apply and launch ask.

Today the answer comes from the device catalog (a format the device has no native path for
is not offered; see `DeviceSpec.supports`). The per-device implementation table built from
the kernels' dispatch code is meant to answer it here later, so callers never change.
"""

from __future__ import annotations

from ..hardware.device import DeviceSpec


def precision_refusal(device: DeviceSpec, precision: str) -> str | None:
    """Why `device`'s runtime cannot run `precision`, or None when it can."""
    if precision == "fp32" or device.supports(precision):
        return None
    return (f"{precision} is not run by device {device.name}'s runtime "
            f"(it runs {', '.join(device.precisions)})")
