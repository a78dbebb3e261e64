"""A GPU group is never given CPU timings as its measured costs: the per-op profiler builds and times on CPU tensors,
so on a machine with that GPU `qsync-opt profile` refuses the group (naming it and the fix), `costs: auto` prices it
by the roofline and says why, and `costs: measured` is an error naming the group."""

from __future__ import annotations

import pytest

from qsync_opt.training.predictor import profile_costs, profile_run
from qsync_opt.training.predictor.profile import ProfileError
from qsync_opt.training.spec import load_spec

SPEC = """
cluster:
  groups:
    - {name: cpu, device: cpu-local, env: {OMP_NUM_THREADS: "1"}}
    - {name: gpu, device: H100-SXM}
model: {name: tiny-cnn}
training: {global_batch: 4, optimizer: sgd}
costs: %s
"""


@pytest.fixture
def h100_here(monkeypatch):
    """This machine, as the code sees it, has an H100 (every device is local)."""
    monkeypatch.setattr(profile_run, "is_local", lambda device: True)
    monkeypatch.setattr(profile_costs, "is_local", lambda device: True)


def test_profile_refuses_the_gpu_group_and_names_it(h100_here, tmp_path):
    with pytest.raises(ProfileError, match=r"group gpu runs on H100-SXM, a GPU: .*CPU tensors only.*--groups"):
        profile_run.profile_spec(load_spec(SPEC % "auto"), tmp_path / "p.json", progress=False)
    assert not (tmp_path / "p.json").exists()  # refused before anything was measured or written


def test_costs_auto_prices_the_gpu_group_by_the_roofline_and_says_why(h100_here):
    spec = load_spec(SPEC % "auto")
    gpu = spec.cluster.groups[1]
    costs, why = profile_costs.measured_costs(spec, gpu, None, ("bf16",))
    assert costs is None and why.startswith("roofline (H100-SXM is here, but the training profiler times")


def test_costs_measured_is_an_error_naming_the_group(h100_here):
    spec = load_spec(SPEC % "measured")
    with pytest.raises(ProfileError, match=r"cluster.groups\[gpu\]: costs: measured, but the training profiler"):
        profile_costs.measured_costs(spec, spec.cluster.groups[1], None, ("bf16",))
