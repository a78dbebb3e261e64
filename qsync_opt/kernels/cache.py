"""Where built artefacts live, what their cache key is, and how concurrent builders stay apart.

Key = sha256 of every rendered file + the toolchain (compiler version, torch and Python versions,
flags, and the host ISA when -march=native is used). The directory is
<root>/<module name>_<key[:12]>/, so a listing reads as the parameters. A build marker written
atomically after a successful build is what makes a later lookup a hit.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from qsync_opt.io import atomic_write_text

MARKER = "build.json"


def cache_root(override: str | os.PathLike | None = None) -> Path:
    """$QSYNC_OPT_CACHE, else ~/.cache/qsync_opt/kernels (an explicit override wins over both)."""
    if override is not None:
        return Path(override)
    env = os.environ.get("QSYNC_OPT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "qsync_opt" / "kernels"


@functools.lru_cache(maxsize=None)
def compiler_version(cmd: str) -> str:
    """First line of `cmd --version`, or 'missing' (the build then fails with its own message)."""
    exe = shutil.which(cmd)
    if exe is None:
        return "missing"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return " | ".join(lines[:4]) if lines else "unknown"


@functools.lru_cache(maxsize=1)
def host_isa() -> str:
    """The CPU feature flags (sorted), so that a -march=native build is never reused on another CPU."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def toolchain(target: str, flags: list[str], compiler: str) -> dict:
    """Everything besides the sources that changes the binary."""
    tc = {"target": target, "compiler": compiler_version(compiler), "torch": torch.__version__,
          "python": f"{sys.implementation.cache_tag}-{platform.machine()}", "flags": list(flags)}
    if any("march=native" in f for f in flags):
        tc["isa"] = host_isa()
    return tc


def cache_key(digest: str, tc: dict) -> str:
    return hashlib.sha256((digest + json.dumps(tc, sort_keys=True)).encode()).hexdigest()


def entry_dir(root: Path, name: str, key: str) -> Path:
    return root / f"{name}_{key[:12]}"


def write_if_changed(path: Path, text: str) -> bool:
    """Write only when the content differs, so that ninja's timestamps do not trigger a rebuild."""
    if path.exists() and path.read_text() == text:
        return False
    atomic_write_text(path, text)
    return True


@contextlib.contextmanager
def file_lock(directory: Path):
    """Exclusive fcntl lock on <directory>/.lock for the duration of a build."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_marker(directory: Path, key: str) -> dict | None:
    """The marker's content if a build with this key completed in `directory`, else None."""
    try:
        data = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if data.get("key") != key:
        return None
    artefact = data.get("artefact")
    if artefact and not (directory / artefact).exists():
        return None
    return data


def write_marker(directory: Path, data: dict) -> None:
    atomic_write_text(directory / MARKER, json.dumps(data, indent=1, sort_keys=True))
