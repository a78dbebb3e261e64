"""The harness's tasks build valid specs: the text task trains a language model on its own data."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from accuracy import TASKS, planning_inputs, training_spec  # noqa: E402
from accuracy_policies import cluster_spec  # noqa: E402

from qsync_opt.jobs import load_spec  # noqa: E402


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_task_trains_on_its_own_data(task):
    spec = load_spec(training_spec(task, {"strong": 16, "t4": 48}, steps=10, seed=0, lr=3e-3))
    if task == "text":
        assert spec.data.name == "pysource" and spec.training.seq_len == 64
    else:
        assert spec.data.name == "mnist1d"


def test_a_task_training_field_joins_the_planning_spec_instead_of_replacing_it(tmp_path):
    model, extra = planning_inputs("text", "weight", 0, 3e-3, tmp_path)
    spec = cluster_spec(model, "V100-32GB", (1024, 1024), None, global_batch=4096, extra=extra, weak_count=3,
                        training={"optimizer": "adam", "lr": 3e-3})
    assert spec["training"]["seq_len"] == 64 and spec["training"]["optimizer"] == "adam"
    assert spec["training"]["global_batch"] == 4096 and spec["data"]["name"] == "pysource"
    load_spec(spec)


@pytest.mark.parametrize("flag,value", [("--clusters", "a100-3t4"), ("--tasks", "gpt"), ("--settings", "fp8"),
                                        ("--policies", "optimal")])
def test_an_unknown_name_exits_2_naming_the_flag_and_the_choices(tmp_path, capsys, flag, value):
    import accuracy

    with pytest.raises(SystemExit) as e:
        accuracy.main(["--out", str(tmp_path), "--plan-only", flag, value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag}: {value} unknown" in err and "comma-separated subset of" in err
    assert not (tmp_path / "policies.json").exists()
