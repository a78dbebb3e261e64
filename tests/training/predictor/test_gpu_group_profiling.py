"""A GPU group's measured costs are measured on its GPU or not at all: the per-op profiler places the model, its inputs
and its clock on the group's device (on_device.py), so a GPU group that is this machine's only rank of the spec is
profiled there; beside other local ranks (the co-located profiler runs CPU ranks only) `qsync-opt profile` refuses it
naming the group, `costs: auto` prices it by the roofline and says why, and `costs: measured` names the group. Where
torch sees no CUDA device the profiler refuses the group rather than time the CPU under the GPU's name.

The CUDA branch (CUDA events, the model moved to cuda:N) has not executed here: these machines have no GPU."""

from __future__ import annotations

import time

import pytest
import torch

from qsync_opt.training.predictor import on_device, profile_costs, profile_run
from qsync_opt.training.predictor.profile import ProfileError
from qsync_opt.training.spec import load_spec

BESIDE_CPU = """
cluster:
  groups:
    - {name: cpu, device: cpu-local, env: {OMP_NUM_THREADS: "1"}}
    - {name: gpu, device: H100-SXM}
model: {name: tiny-cnn}
training: {global_batch: 4, optimizer: sgd}
costs: %s
"""

ALONE = """
cluster:
  groups:
    - {name: gpu, device: H100-SXM}
model: {name: tiny-cnn}
training: {global_batch: 4, optimizer: sgd}
costs: %s
"""


@pytest.fixture
def h100_here(monkeypatch):
    """This machine, as the planning code sees it, has an H100 (every device is local)."""
    for mod in (profile_run, profile_costs):
        monkeypatch.setattr(mod, "is_local", lambda device: True)
    from qsync_opt.training.predictor import measuring

    monkeypatch.setattr(measuring, "is_local", lambda device: True)  # local_ranks counts the H100's rank


def test_profile_refuses_a_gpu_group_beside_other_local_ranks(h100_here, tmp_path):
    with pytest.raises(ProfileError, match=r"group gpu runs on a GPU: H100-SXM is here beside 1 other local rank.*"
                                           r"co-located profiler .* runs CPU ranks only"):
        profile_run.profile_spec(load_spec(BESIDE_CPU % "auto"), tmp_path / "p.json", progress=False)
    assert not (tmp_path / "p.json").exists()  # refused before anything was measured or written


def test_costs_auto_prices_a_colocated_gpu_group_by_the_roofline_and_says_why(h100_here):
    spec = load_spec(BESIDE_CPU % "auto")
    costs, why = profile_costs.measured_costs(spec, spec.cluster.groups[1], None, ("bf16",))
    assert costs is None and why.startswith("roofline (H100-SXM is here beside 1 other local rank")


def test_costs_measured_names_the_colocated_gpu_group(h100_here):
    spec = load_spec(BESIDE_CPU % "measured")
    with pytest.raises(ProfileError, match=r"cluster.groups\[gpu\]: costs: measured, but H100-SXM is here beside"):
        profile_costs.measured_costs(spec, spec.cluster.groups[1], None, ("bf16",))


def test_a_lone_gpu_group_is_profiled_on_its_device(h100_here, tmp_path):
    """Not refused by the planning side: it goes to the measuring process, which places it on the GPU, and here,
    with no CUDA device, refuses to measure it (naming the group) instead of timing the CPU."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: gpu_check profiles on it")
    assert profile_run.gpu_not_profiled(load_spec(ALONE % "auto"), load_spec(ALONE % "auto").cluster.groups[0]) is None
    with pytest.raises(ProfileError, match=r"group 'gpu' failed"):
        profile_run.profile_spec(load_spec(ALONE % "measured"), tmp_path / "p.json", progress=False)
    assert not (tmp_path / "p.json").exists()


def test_profile_device_refuses_a_gpu_group_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    g = load_spec(ALONE % "auto").cluster.groups[0]
    with pytest.raises(ProfileError, match=r"group gpu runs on H100-SXM, but torch .* sees no CUDA device here"):
        on_device.profile_device(g)
    cpu = load_spec(BESIDE_CPU % "auto").cluster.groups[0]
    assert on_device.profile_device(cpu) == torch.device("cpu")
    assert on_device.device_clock(torch.device("cpu")) is time.perf_counter


class _FakeEvent:
    """torch.cuda.Event's timing surface on a scripted GPU timeline (ms)."""
    now_ms = 0.0
    waited = 0

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None

    def record(self):
        self.t = _FakeEvent.now_ms

    def synchronize(self):
        _FakeEvent.waited += 1

    def elapsed_time(self, other):
        return other.t - self.t


def test_event_clock_reads_the_gpu_timeline_in_seconds(monkeypatch):
    """EventClock's readings are event times since its base event, in seconds, each waited for; the estimator
    reads an op's time on it (the GPU's 2.5 ms, whatever the host's wall clock did)."""
    from contextlib import nullcontext

    from qsync_opt.training.predictor import estimator

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "device", lambda d: nullcontext())
    _FakeEvent.now_ms, _FakeEvent.waited = 100.0, 0
    clock = on_device.EventClock(torch.device("cuda", 0))

    def op():  # the GPU works 2.5 ms per call
        _FakeEvent.now_ms += 2.5

    assert clock() == 0.0 and _FakeEvent.waited == 1
    ms = estimator.robust_ms(op, clock=clock, blocks=3, repeats=2)
    assert ms == pytest.approx(2.5)
    assert _FakeEvent.waited > 6  # every reading waited for its event
