"""What the benchmark scripts' --smoke settings share (tests/benchmarks/test_smoke.py runs every script with it).

A smoke run exercises a script's whole path on the smallest inputs; its figures mean nothing. It writes only to the
folders it is given, never to benchmarks/results, docs/img or the user's profile cache.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

#: The profiler's estimator at its fewest timed calls (one block of one call per entry); profiling subprocesses
#: inherit it from the environment.
PROFILE_ENV = {"QSYNC_OPT_PROFILE_BLOCKS": "1", "QSYNC_OPT_PROFILE_REPEATS": "1", "QSYNC_OPT_PROFILE_BUDGET_MS": "1"}


def rough_profiles(folder: Path) -> None:
    """Profile at the fewest timed calls from here on (this process and its children), into `folder`: such a rough
    profile must never land in the user's cache, where a real run would reuse it."""
    os.environ.update(PROFILE_ENV, QSYNC_OPT_PROFILE_DIR=str(folder))


def tiny_spec(folder: Path, precisions=("fp32",)) -> Path:
    """examples/cpu_tiny.yaml with every group offering only `precisions` (fewer kernels to profile and plan),
    written to folder/cpu_tiny_smoke.yaml."""
    spec = yaml.safe_load((ROOT / "examples" / "cpu_tiny.yaml").read_text())
    for g in spec["cluster"]["groups"]:
        g["precisions"] = list(precisions)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cpu_tiny_smoke.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
