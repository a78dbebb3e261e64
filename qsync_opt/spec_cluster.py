"""The cluster section of a job spec: device groups (catalog or inline devices), their
environments, and the links between them."""

from __future__ import annotations

import difflib
from typing import Literal, Union

from pydantic import Field, field_validator, model_validator

from qsync_opt.hardware.device import DeviceSpec, catalog, find_device
from qsync_opt.precision import PrecisionName
from qsync_opt.spec_base import SpecModel as _Model
from qsync_opt.spec_yaml import INT_ENV

#: Interconnect presets: (bandwidth in GB/s per direction, latency in microseconds).
INTERCONNECTS: dict[str, tuple[float, float]] = {
    "pcie3": (16.0, 10.0),
    "pcie4": (32.0, 8.0),
    "nvlink-v100": (300.0, 5.0),
    "nvlink-a100": (600.0, 5.0),
    "nvlink-h100": (900.0, 5.0),
    "ethernet-10g": (1.25, 50.0),
    "ethernet-25g": (3.125, 30.0),
    "ethernet-100g": (12.5, 20.0),
    "infiniband-hdr": (25.0, 5.0),
    "loopback": (5.0, 20.0),
}



class Interconnect(_Model):
    """Link between device groups; the slowest link bounds a ring all-reduce."""

    bandwidth_gbs: float = Field(gt=0)
    """Bandwidth per direction in GB/s."""
    latency_us: float = Field(default=10.0, ge=0)
    """One-hop latency in microseconds."""


class DeviceGroup(_Model):
    """Identical devices that get one shared plan."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$")
    """Group name used in the plan, e.g. 't4'."""
    device: Union[str, DeviceSpec]
    """A catalog device name (see `qsync-opt devices`) or an inline custom device."""
    count: int = Field(default=1, ge=1)
    """Number of devices (data-parallel ranks) in this group."""
    memory_gb: float | None = Field(default=None, gt=0)
    """Override the usable memory per device (e.g. what the scheduler leaves free)."""
    precisions: list[PrecisionName] | None = None
    """Precisions this group may use; default: every format the device runs natively."""
    local_batch: int | None = Field(default=None, ge=1)
    """Per-device batch; default: the global batch split evenly over all devices."""
    role: Literal["auto", "training", "inference"] = "auto"
    """'training' groups set the synchronisation bound at their own precision; 'auto' decides by speed."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment for this group's ranks (CPU emulation, e.g. ONEDNN_MAX_CPU_ISA). Trusted input: it
    configures processes you launch. Keys that load code (LD_PRELOAD, PYTHONPATH, PYTHONSTARTUP, PATH, ...)
    are refused unless the spec sets allow_code_env: true."""
    profile: str | None = None
    """A measured profile file for this group's device (`qsync-opt profile -o`); default: this
    machine's cached profile for devices that run here, else the roofline."""

    @field_validator("env")
    @classmethod
    def _env_values(cls, v):
        for key in INT_ENV:
            if key in v and not (v[key].strip().isdigit() and int(v[key]) >= 1):
                raise ValueError(f"{key}={v[key]!r} is not a positive integer (a thread count); write e.g. {key}: \"2\"")
        return v

    @field_validator("device", mode="before")
    @classmethod
    def _fp8_spelled_as_precisions(cls, v):
        """Inline devices may key fp8 rates by the precision names (fp8_e4m3, fp8_e5m2), as plans do."""
        if not isinstance(v, dict):
            return v
        out = dict(v)
        for table in ("peak_tflops", "efficiency"):
            rates = out.get(table)
            if not isinstance(rates, dict) or not {"fp8_e4m3", "fp8_e5m2"} & set(rates):
                continue
            rates = dict(rates)
            given = {k: rates.pop(k) for k in ("fp8", "fp8_e4m3", "fp8_e5m2") if k in rates}
            if len(set(map(str, given.values()))) > 1:
                raise ValueError(f"{table}: {given} differ; fp8_e4m3 and fp8_e5m2 share one tensor-core rate, "
                                 "give it once")
            rates["fp8"] = next(iter(given.values()))
            out[table] = rates
        return out

    @field_validator("device")
    @classmethod
    def _known_device(cls, v):
        if isinstance(v, str):
            try:
                find_device(v)
            except KeyError:
                near = difflib.get_close_matches(v, list(catalog()), n=3, cutoff=0.4)
                hint = f" Did you mean {', '.join(near)}?" if near else ""
                raise ValueError(
                    f"unknown device {v!r}.{hint} Known: {', '.join(catalog())}; or give an inline device"
                ) from None
        return v

    @property
    def device_spec(self) -> DeviceSpec:
        spec = self.device if isinstance(self.device, DeviceSpec) else find_device(self.device)
        if self.memory_gb is not None:
            spec = spec.model_copy(update={"memory_gb": self.memory_gb})
        return spec

    @property
    def allowed_precisions(self) -> tuple[str, ...]:
        dev = self.device_spec.precisions
        return tuple(p for p in dev if self.precisions is None or p in self.precisions)

    @field_validator("precisions")
    @classmethod
    def _precisions_supported(cls, v, info):
        if v is None or "device" not in info.data:
            return v
        if not v:
            raise ValueError("must not be empty; omit the field to allow every supported format")
        d = info.data["device"]
        dev = d if isinstance(d, DeviceSpec) else find_device(d)
        bad = [p for p in v if not dev.supports(p)]
        if bad:
            raise ValueError(f"{bad} not supported by device {dev.name}; it supports {list(dev.precisions)}")
        return v


class Cluster(_Model):
    groups: list[DeviceGroup] = Field(min_length=1)
    """Device groups; ranks are numbered group by group in this order."""
    interconnect: Union[str, Interconnect] = "pcie4"
    """A preset name or {bandwidth_gbs, latency_us}."""

    @field_validator("interconnect")
    @classmethod
    def _known_link(cls, v):
        if isinstance(v, str) and v not in INTERCONNECTS:
            raise ValueError(f"unknown interconnect preset {v!r}; presets: {', '.join(INTERCONNECTS)}")
        return v

    @model_validator(mode="after")
    def _unique_names(self) -> "Cluster":
        names = [g.name for g in self.groups]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"group names must be unique, repeated: {dup}")
        return self

    @property
    def link(self) -> Interconnect:
        if isinstance(self.interconnect, Interconnect):
            return self.interconnect
        bw, lat = INTERCONNECTS[self.interconnect]
        return Interconnect(bandwidth_gbs=bw, latency_us=lat)

    @property
    def world_size(self) -> int:
        return sum(g.count for g in self.groups)

    def group_of_rank(self, rank: int) -> DeviceGroup:
        for g in self.groups:
            if rank < g.count:
                return g
            rank -= g.count
        raise IndexError(f"rank out of range for world size {self.world_size}")

    def first_rank(self, group: str) -> int:
        """The lowest rank of group `group` (ranks are numbered group by group, in spec order)."""
        rank = 0
        for g in self.groups:
            if g.name == group:
                return rank
            rank += g.count
        raise KeyError(f"no group {group!r} in cluster.groups")
