"""The accuracy harness trains what it reports: each rank applies its own group's precision map."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from accuracy import runtime_plan, train_batches, training_spec  # noqa: E402

from qsync_opt.runtime.apply import current_precisions  # noqa: E402
from qsync_opt.runtime.qmodules import QuantizedModule  # noqa: E402
from qsync_opt.training.runtime.trainer import build_rank_model, rank_batches  # noqa: E402
from qsync_opt.training.spec import load_spec  # noqa: E402

OPS = ("stem", "layer1.conv1", "layer1.conv2", "down", "layer2.conv1", "layer2.conv2", "fc")


def test_the_weak_rank_runs_the_weak_groups_formats_and_the_strong_rank_stays_fp32():
    batches = train_batches({"strong": 3072, "t4": 1024}, 64)
    assert batches == {"strong": 48, "t4": 16}
    spec = load_spec(training_spec("cnn", batches, 10, 0, 3e-3))
    t4 = dict.fromkeys(OPS, "int4") | {"down": "int8", "fc": "int8"}
    plan = runtime_plan(spec, {"strong": dict.fromkeys(OPS, "fp32"), "t4": t4}, batches)
    assert rank_batches(spec, plan) == [48, 16]
    strong, weak = build_rank_model(spec, plan, "strong"), build_rank_model(spec, plan, "t4")
    assert current_precisions(strong) == dict.fromkeys(OPS, "fp32")
    assert not any(isinstance(m, QuantizedModule) for m in strong.modules())
    assert current_precisions(weak) == t4
    assert weak.stem.recipe.granularity == "per_tensor" and weak.stem.recipe.backward == "bf16"
    # same initial weights on both ranks (DDP would otherwise start from two models)
    assert all((a == b).all() for a, b in zip(strong.state_dict().values(), weak.state_dict().values()))


def test_a_gpu_plan_with_fp16_validates_for_training_here_and_tail_evaluation_is_switched_on():
    from qsync_opt.training.runtime.launch import validate

    batches = {"strong": 40, "t4": 24}
    spec = load_spec(training_spec("cnn", batches, 10, 0, 3e-3, eval_every=10))
    assert spec.data.eval_every == 10 and spec.cluster.groups[0].device_spec.kind == "cpu"
    t4 = dict.fromkeys(OPS, "fp16") | {"fc": "int4"}
    plan = runtime_plan(spec, {"strong": dict.fromkeys(OPS, "fp32"), "t4": t4}, batches)
    assert validate(spec, plan) == [40, 24]
    assert current_precisions(build_rank_model(spec, plan, "t4")) == t4


def test_planning_on_trained_weights_and_the_tasks_data_gives_a_spec_the_library_accepts(tmp_path):
    import pytest
    import torch
    from accuracy import main, planning_inputs
    from accuracy_policies import cluster_spec

    model, extra = planning_inputs("cnn", "empirical", 5, 3e-3, tmp_path)
    state = torch.load(model["checkpoint"])
    assert set(state) >= {"stem.weight", "fc.weight"}
    spec = load_spec(cluster_spec(model, "V100-32GB", (3072, 1024), ("int8", "int4"), global_batch=4096, extra=extra))
    assert spec.indicator.method == "empirical" and spec.data.name == "mnist1d"
    assert spec.model.checkpoint == str(tmp_path / "checkpoint-cnn-5.pt")
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path), "--plan-only", "--indicator", "weight,fisher,gvar@x"])
    assert e.value.code == 2


def test_the_harness_plans_with_the_librarys_default_indicator_and_never_silently_falls_back(tmp_path, monkeypatch):
    """--indicator auto (the default): the ILP plan is made with the empirical indicator on fp32-warmed
    weights, as `qsync-opt run` makes it, and every policy records that indicator."""
    from accuracy import planning_inputs, planning_training
    from accuracy_policies import plan_policies

    from qsync_opt.training.spec import IndicatorSpec

    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path / "cache"))
    assert IndicatorSpec().method == "auto"  # the library's default is what the harness's default stands for
    model, extra = planning_inputs("cnn", "auto", 5, 3e-3, tmp_path)
    assert extra["indicator"] == {"method": "auto", "warmup_steps": 5} and "checkpoint" not in model
    pols = plan_policies(model, "V100-32GB", (3072, 1024), ("int8", "int4"), 4096, extra,
                         training=planning_training(3e-3))
    used = pols["ilp"].indicator_used
    assert "empirical" in used and "auto" in used and "fell back" not in used, used
    assert "5 fp32 steps" in used and "cached" not in used  # the cache path is dropped from the CSV's note
    assert pols["greedy"].indicator_used == used == pols["joint"].indicator_used


def test_plan_only_writes_the_plans_with_the_command_that_made_them(tmp_path):
    import csv

    from accuracy import PLAN_FIELDS, main

    assert main(["--out", str(tmp_path), "--plan-only", "--tasks", "cnn", "--clusters", "v100-t4",
                 "--settings", "intonly", "--indicator", "weight", "--policies", "uniform-lowest,ilp"]) == 0
    text = (tmp_path / "plans.csv").read_text().splitlines()
    assert text[0].startswith("# command: python benchmarks/accuracy.py --out ") and "--plan-only" in text[0]
    rows = list(csv.DictReader(x for x in text if not x.startswith("#")))
    assert tuple(rows[0]) == PLAN_FIELDS and "test_accuracy" not in PLAN_FIELDS
    assert [r["policy"] for r in rows] == ["uniform-lowest", "ilp"]
    assert rows[0]["t4_precisions"] == "int4:7" and float(rows[1]["predicted_ms"]) > 0
