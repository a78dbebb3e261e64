"""QSync's setting in the accuracy harness: every device the same local batch, the bound uniform-lowest's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from accuracy import SETTINGS, TASKS, train_batches  # noqa: E402
from accuracy_policies import cluster_spec, equal_split  # noqa: E402

from qsync_opt.training.pipeline import prepare  # noqa: E402
from qsync_opt.training.predictor.instance_builder import baseline, build_instance  # noqa: E402
from qsync_opt.training.predictor.replayer import replay  # noqa: E402
from qsync_opt.training.spec import load_spec  # noqa: E402


def test_the_weak_rank_carries_every_weak_devices_samples():
    assert train_batches({"strong": 1024, "t4": 1024}, 64, {"t4": 3}) == {"strong": 16, "t4": 48}  # 1 : 3 devices
    assert train_batches({"strong": 2048, "t4": 2048}, 64) == {"strong": 32, "t4": 32}


def test_equal_split_gives_every_device_the_same_batch_and_bounds_by_uniform_lowest():
    weak = SETTINGS["qsync-intonly"][0]
    split, bound = equal_split(TASKS["cnn"][0], "V100-32GB", weak, 4096, 3)
    assert split == (1024, 1024)
    spec = load_spec(cluster_spec(TASKS["cnn"][0], "V100-32GB", split, weak, global_batch=4096, weak_count=3,
                                  bound=bound))
    assert spec.cluster.groups[1].count == 3 and spec.local_batches() == {"strong": 1024, "t4": 1024}
    prepared = prepare(spec)
    inst, ctx = build_instance(spec, prepared.graph, prepared.sensitivity, boundary=spec.runtime.boundary)
    lowest = replay(ctx, baseline(inst, "lowest"))
    assert bound == pytest.approx(lowest.iteration_ms, rel=1e-6)
    assert set(baseline(inst, "lowest")["t4"].values()) == {"int4"}
    assert set(baseline(inst, "lowest")["strong"].values()) == {"fp32"}  # role training: the strong GPU stays fp32
