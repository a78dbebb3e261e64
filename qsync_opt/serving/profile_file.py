"""The serving profile file: one JSON file per machine, {format, version, machine, tables: {table key: {shape,
entries: {entry key: ms}}}} (serving/profile.py measures and reads its tables). Imports no torch."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from qsync_opt.errors import SpecError
from qsync_opt.hardware.machine import cpu_description, profile_dir
from qsync_opt.io import atomic_write_text

FORMAT = "qsync-opt-serving-profile"
VERSION = 1


def machine_description() -> dict:
    """CPU model and the ISA flags that select kernels (a GPU table also names its GPU in its key)."""
    return cpu_description()


def cache_dir() -> Path:
    """The training profiler's folder (hardware.machine.profile_dir)."""
    return profile_dir()


def default_path() -> Path:
    """This machine's serving profile file, named by a digest of its description."""
    digest = hashlib.sha256(json.dumps(machine_description(), sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / f"serving-profile-{digest}.json"


def torch_version() -> str:
    try:
        return version("torch")
    except PackageNotFoundError:
        return "none"


@dataclass
class ServingProfile:
    """The file: {format, version, machine, tables: {table key: {shape, entries: {entry key: ms}}}}."""

    machine: dict
    tables: dict[str, dict] = field(default_factory=dict)

    def entries(self, key: str) -> dict[str, float]:
        return self.tables.get(key, {}).get("entries", {})

    def save(self, path: "str | Path") -> Path:
        data = {"format": FORMAT, "version": VERSION, "machine": self.machine, "tables": self.tables}
        return atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def load(path: "str | Path") -> ServingProfile:
    """The profile at `path` (empty when there is none); SpecError naming the file when it cannot be trusted."""
    path = Path(path)
    if not path.exists():
        return ServingProfile(machine_description())
    if path.is_dir():
        raise SpecError(f"serving profile {path}: a folder, not a profile file; give a file in it, e.g. "
                        f"{path / 'serving-profile.json'}")
    fix = f"delete {path} and run `qsync-opt profile SPEC` again"
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecError(f"serving profile {path}: not readable JSON ({e}); {fix}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("version") != VERSION:
        got = (raw.get("format"), raw.get("version")) if isinstance(raw, dict) else None
        raise SpecError(f"serving profile {path}: format/version {got}, this release reads ({FORMAT!r}, {VERSION}); {fix}")
    tables = raw.get("tables")
    ok = isinstance(tables, dict) and all(
        isinstance(t, dict) and isinstance(t.get("entries"), dict)
        and all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in t["entries"].values())
        for t in tables.values())
    if not ok:
        raise SpecError(f"serving profile {path}: 'tables' is not {{key: {{entries: {{name: ms ≥ 0}}}}}}; {fix}")
    if raw.get("machine") != machine_description():
        raise SpecError(f"serving profile {path}: measured on another machine ({raw.get('machine')}); {fix}")
    return ServingProfile(raw["machine"], tables)
