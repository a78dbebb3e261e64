"""The real run refuses, before Ray starts, models that do not fit this machine: exit-2 material naming rollout.model,
the sizes and the fix (no Ray needed to test it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qsync_opt.errors import SpecError
from qsync_opt.jobs import load_spec
from qsync_opt.rollout import ray_run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_laminar_example_is_refused_naming_the_model_and_the_sizes():
    job = load_spec(EXAMPLES / "rollout_laminar.yaml")
    with pytest.raises(SpecError) as e:
        ray_run.check_runs_here(job, available_bytes=24 * 2**30)
    msg = str(e.value)
    assert msg.startswith("rollout.model:") and "llama-3-8b" in msg and "8.03 B parameters" in msg
    assert "64 rollout actors" in msg and "24.0 GiB available" in msg and "rollout_cpu_tiny.yaml" in msg


def test_the_tiny_example_fits_and_the_bound_is_the_memory():
    job = load_spec(EXAMPLES / "rollout_cpu_tiny.yaml")
    ray_run.check_runs_here(job, available_bytes=1 * 2**30)  # 4 actors of a 115k-parameter model
    with pytest.raises(SpecError, match="rollout.model"):
        ray_run.check_runs_here(job, available_bytes=1e6)  # (4 + 6) x 4 B x 114,688 = 4.6 MB > 0.8 MB


def test_run_rounds_refuses_before_starting_ray(monkeypatch):
    job = load_spec(EXAMPLES / "rollout_laminar.yaml")
    monkeypatch.setattr(ray_run, "_available_bytes", lambda: 24 * 2**30)

    def no_ray(*a, **k):
        raise AssertionError("Ray started for a run that cannot fit")

    monkeypatch.setattr(ray_run, "start_ray", no_ray)
    with pytest.raises(SpecError, match="rollout.model"):
        ray_run.run_rounds(job, 1)
