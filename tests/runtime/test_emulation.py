"""A spec whose devices are not here is emulated only when announced, and only when asked where
it would be more than 10x slower; reports never set the CPU's time against the devices' prediction."""

import json
import math
from pathlib import Path

import pytest
import yaml

from qsync_opt.cli import commands as cli
from qsync_opt.errors import RuntimeSetupError
from qsync_opt.runtime import emulation
from qsync_opt.training.runtime import launch
from qsync_opt.training.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]


def gpu_job(tmp: Path, devices=("V100-32GB", "T4"), emulate: bool | None = None) -> Path:
    """A small job (tiny-cnn) on two GPU groups: on this CPU-only machine both are emulated."""
    groups = [{"name": d.split("-")[0].lower(), "device": d, "count": 1, "local_batch": 8} for d in devices]
    data = {"name": "gpu-job", "cluster": {"groups": groups, "interconnect": "loopback"}, "model": {"name": "tiny-cnn"},
            "training": {"global_batch": 16, "steps": 2}}
    if emulate is not None:
        data["runtime"] = {"emulate": emulate}
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(emulation, "cuda_here", lambda: False)

    def spawned(*a, **k):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(launch, "spawn_ranks", spawned)


def test_gpu_groups_on_a_cpu_are_emulated_with_their_slowdown():
    found = emulation.emulated_groups(load_spec(str(ROOT / "examples/hybrid_v100_t4_resnet50.yaml")), cuda=False)
    assert [e.group for e in found] == ["v100", "t4"]
    assert all(e.slowdown > emulation.EMULATION_LIMIT for e in found)
    assert "emulated on this CPU" in found[0].describe() and "slower than on V100-32GB" in found[0].describe()
    assert emulation.emulated_groups(load_spec(str(ROOT / "examples/cpu_tiny.yaml")), cuda=False) == []
    assert emulation.emulated_groups(load_spec(str(ROOT / "examples/hybrid_v100_t4_resnet50.yaml")), cuda=True) == []


def test_fp16_on_a_cpu_has_no_bound():
    from qsync_opt.training.plan import Plan

    spec = load_spec(str(ROOT / "examples/hybrid_v100_t4_resnet50.yaml"))

    from types import SimpleNamespace

    # the one thing emulated_groups reads of a plan group
    plan = Plan.model_construct(groups={"t4": SimpleNamespace(precisions={"layer1.0.conv1": "fp16"})})
    t4 = next(e for e in emulation.emulated_groups(spec, plan, cuda=False) if e.group == "t4")
    assert math.isinf(t4.slowdown) and "fp16" in t4.worst


def test_train_refuses_a_slow_emulation_before_any_rank_starts(tmp_path, no_cuda, capsys):
    with pytest.raises(RuntimeSetupError, match=r"--emulate"):
        launch.run_job(str(gpu_job(tmp_path)), None, metrics_dir=str(tmp_path / "m"))
    err = capsys.readouterr().err
    assert "group 'v100' (V100-32GB) emulated on this CPU" in err and "group 't4' (T4)" in err


def test_run_refuses_before_profiling(tmp_path, no_cuda, capsys):
    assert cli.main(["run", str(gpu_job(tmp_path)), "-o", str(tmp_path / "out")]) == 2
    assert "--emulate" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["flag", "spec"])
def test_asked_for_emulation_is_announced_and_recorded(tmp_path, monkeypatch, how, capsys):
    monkeypatch.setattr(emulation, "cuda_here", lambda: False)

    class Stop(Exception):
        pass

    def spawned(*a, **k):
        raise Stop

    monkeypatch.setattr(launch, "spawn_ranks", spawned)
    spec = gpu_job(tmp_path, emulate=True if how == "spec" else None)
    with pytest.raises(Stop):  # got as far as starting ranks
        launch.run_job(str(spec), None, metrics_dir=str(tmp_path / "m"), emulate=how == "flag")
    assert "emulated on this CPU" in capsys.readouterr().err
    recorded = json.loads((tmp_path / "m" / "emulation.json").read_text())
    assert [e["group"] for e in recorded] == ["v100", "t4"] and recorded[0]["expected_slowdown"] > 10


def test_report_never_divides_an_emulated_measurement_by_a_device_prediction(tmp_path):
    from qsync_opt.training.run_report import _prediction_lines

    metrics = tmp_path / "train"
    metrics.mkdir()
    for r in (0, 1):
        (metrics / f"rank{r}.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0, "step_ms": 3000.0}) + "\n"
                                                        for s in (1, 2, 3)))
    (tmp_path / "predict.json").write_text(json.dumps({"iteration_ms": 100.0, "trace": "t.json",
                                                       "groups": {"a100": {"costs": "roofline"}}}))
    plain = "\n".join(_prediction_lines(tmp_path, metrics))
    assert "Measured / predicted: 30.00x" in plain
    (metrics / "emulation.json").write_text(json.dumps([{"group": "a100", "device": "A100-40GB"}]))
    text = "\n".join(_prediction_lines(tmp_path, metrics))
    assert "Measured / predicted" not in text and "Not comparable" in text and "a100 (A100-40GB)" in text


def test_a_rank_under_torchrun_refuses_alike(tmp_path, monkeypatch, capsys):
    import argparse

    from qsync_opt.training.runtime.torchrun import train_rank

    monkeypatch.setattr(emulation, "cuda_here", lambda: False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for key in ("QSYNC_GROUP", "OMP_NUM_THREADS"):  # train_rank sets them: restored after the test
        monkeypatch.setenv(key, "1")
    args = argparse.Namespace(spec=str(gpu_job(tmp_path)), plan=None, threads=1, force=False, resume=False,
                              checkpoint_dir=None, checkpoint_every=10, metrics_dir=None, steps=None, emulate=False)
    assert train_rank(args) == 2  # bad input, one line, before the rank joins any rendezvous
    assert "--emulate" in capsys.readouterr().err
