"""DeviceSpec: what the planner needs to know about one accelerator, and the catalog of known ones.

Catalog entries (catalog.yaml) and inline custom devices in a spec go through the same
validation, so a custom device can never be less complete than a catalog one.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from qsync_opt.precision import PEAK_KEY, PRECISIONS

PeakKey = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4"]


class DeviceSpec(BaseModel):
    """One accelerator model: capacity, bandwidth and dense peak throughput per precision."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str
    """Catalog key, e.g. 'T4' or 'A100-80GB'."""
    kind: Literal["gpu", "cpu"] = "gpu"
    memory_gb: float = Field(gt=0)
    """Device memory in GB (10^9 bytes)."""
    bandwidth_gbs: float = Field(gt=0)
    """Peak memory bandwidth in GB/s."""
    peak_tflops: dict[PeakKey, float]
    """Dense peak throughput in TFLOP/s (TOP/s for int). A missing key means the format has no fast path."""
    efficiency: dict[PeakKey, float] = Field(default_factory=dict)
    """Achieved fraction of peak for large GEMMs per precision (default 0.6). For linear and conv ops
    a factor measured on this architecture (hardware/calibration.py) takes its place."""
    bandwidth_efficiency: float = Field(default=0.8, gt=0, le=1)
    """Achieved fraction of peak memory bandwidth for streaming kernels."""
    launch_overhead_us: float = Field(default=5.0, ge=0)
    """Typical per-kernel launch overhead in microseconds."""
    sm: int | None = None
    """CUDA compute capability as an integer (75 = sm_75); None for CPUs."""
    source: str = ""
    """Where the numbers come from (datasheet title/URL or 'measured on ...')."""
    _kernels: str = PrivateAttr(default="auto")

    @property
    def kernels(self) -> str:
        """The runtime's `kernels` setting this device is priced for (see with_kernels)."""
        return self._kernels

    def with_kernels(self, kernels: str) -> "DeviceSpec":
        """This device as the runtime runs it under `runtime.kernels` (auto | templated | torch):
        which formats are offered and at which rate follow the implementation dispatch picks then."""
        from qsync_opt.kernels.dispatch import KERNELS  # import cost: torch, via kernels.dispatch

        if kernels not in KERNELS:
            raise ValueError(f"runtime.kernels: {kernels!r}; use one of {', '.join(KERNELS)}")
        dev = self.model_copy()
        dev._kernels = kernels
        return dev

    @field_validator("peak_tflops")
    @classmethod
    def _needs_fp32(cls, v: dict[str, float]) -> dict[str, float]:
        if "fp32" not in v:
            raise ValueError("peak_tflops must include fp32 (every device runs fp32)")
        bad = {k: x for k, x in v.items() if x <= 0}
        if bad:
            raise ValueError(f"peak_tflops values must be > 0, got {bad}; omit a format to mark it unsupported")
        return v

    @field_validator("efficiency")
    @classmethod
    def _efficiency_range(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not 0 < x <= 1}
        if bad:
            raise ValueError(f"efficiency values must be in (0, 1], got {bad}")
        return v

    @model_validator(mode="after")
    def _efficiency_keys_known(self) -> "DeviceSpec":
        extra = set(self.efficiency) - set(self.peak_tflops)
        if extra:
            raise ValueError(f"efficiency given for formats without peak_tflops: {sorted(extra)}")
        return self

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    def supports(self, precision: str) -> bool:
        """Whether the planner may offer `precision` here: the datasheet lists its rate and the
        runtime's dispatch (kernels/dispatch.py) runs it without emulating it through fp32."""
        from qsync_opt.kernels.dispatch import offer  # import cost: torch, via kernels.dispatch

        return PEAK_KEY[precision] in self.peak_tflops and offer(self, precision, self._kernels)[0]

    def backward_format(self, requested: str) -> str:
        """The runtime.backward_precision a group on this device runs (and the planner prices): 'fp8' as requested
        where the device runs an fp8 format (its fp8 linears take fp8 gradients, other quantized ops bf16);
        otherwise the requested 16-bit format or fp32 if the device runs it, else the best 16-bit one it runs
        (bf16, then fp16), else fp32 (a T4 runs fp16 where bf16 is asked)."""
        if requested == "fp8" and any(self.supports(p) for p in ("fp8_e4m3", "fp8_e5m2")):
            return "fp8"
        for p in (requested, "bf16", "fp16"):
            if p in ("bf16", "fp16", "fp32") and self.supports(p):
                return p
        return "fp32"

    @property
    def precisions(self) -> tuple[str, ...]:
        """Precisions this device runs natively, highest first."""
        return tuple(p for p in PRECISIONS if self.supports(p))

    def rate_key(self, precision: str) -> str:
        """The peak_tflops key that prices `precision`: that of the implementation the runtime
        executes here (kernels/dispatch.py), e.g. 'int8' for int4 emulated through the int8 path."""
        from qsync_opt.kernels.dispatch import implementation  # import cost: torch, via kernels.dispatch

        return implementation(self, precision, self._kernels).rate

    def peak_flops(self, precision: str) -> float:
        return self.peak_tflops[self.rate_key(precision)] * 1e12

    def calibration(self, precision: str, op_kind: str | None, backward: str | None = None):
        """The measured factor (hardware/calibration.py) that prices `precision` ops of `op_kind`
        ('linear' or 'conv') here, or None: the catalog efficiency then applies. `backward` 'fp8':
        of a module whose backward GEMMs run in fp8 too."""
        from qsync_opt.hardware.calibration import lookup  # import cost: torch, via kernels.dispatch

        return lookup(self, precision, op_kind, backward)

    def achieved_flops(self, precision: str, op_kind: str | None = None, backward: str | None = None) -> float:
        """Peak of the rate that runs `precision` times the achieved fraction: the calibrated factor
        for `op_kind` (and `backward`) where this architecture was measured (`calibration`), else the
        catalog's `efficiency` (0.6 when absent)."""
        key = self.rate_key(precision)
        cal = self.calibration(precision, op_kind, backward) if op_kind else None
        eff = cal.factor if cal is not None else self.efficiency.get(key, 0.6)
        return self.peak_tflops[key] * 1e12 * eff


@lru_cache(maxsize=1)
def catalog() -> dict[str, DeviceSpec]:
    """The built-in devices, keyed by name (case-sensitive; `find_device` is forgiving)."""
    text = resources.files("qsync_opt.hardware").joinpath("catalog.yaml").read_text()
    raw = yaml.safe_load(text) or {}
    return {name: DeviceSpec(name=name, **entry) for name, entry in raw["devices"].items()}


def find_device(name: str) -> DeviceSpec:
    """Catalog lookup that ignores case and '-'/'_'; a miss lists the known names."""
    cat = catalog()
    norm = {k.lower().replace("_", "-"): k for k in cat}
    key = norm.get(name.lower().replace("_", "-"))
    if key is None:
        raise KeyError(f"unknown device {name!r}; known: {', '.join(cat)}")
    return cat[key]


def catalog_table(kernels: str = "auto"):
    """kernels.dispatch's implementation rows for every catalog device."""
    from qsync_opt.kernels.dispatch import implementation_table  # import cost: torch, via kernels.dispatch

    return implementation_table(catalog().values(), kernels)


if __name__ == "__main__":  # python -m qsync_opt.hardware.device [auto|templated|torch]: print what runs where
    import sys

    from qsync_opt.kernels.dispatch import format_table

    from qsync_opt.hardware.calibration import factors

    print(format_table(catalog_table(kernels=sys.argv[1] if len(sys.argv) > 1 else "auto")))
    print("\ncalibrated factors (hardware/calibration.yaml; devices of that sm whose dispatch runs that implementation):")
    for f in factors():
        print(f"  {f.describe()}")
