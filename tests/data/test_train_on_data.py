"""`train` on real data: user model and data factory beside the spec, two ranks, test-set evaluation logged."""

from __future__ import annotations

import csv
import json

import pytest
from data_jobs import fp32_plan, write_job

from qsync_opt.training.runtime.launch import run_job

pytestmark = pytest.mark.slow


def test_two_ranks_train_a_user_model_on_user_data_and_log_test_accuracy(tmp_path, monkeypatch):
    elsewhere = tmp_path / "cwd"  # neither the spec's folder nor on PYTHONPATH: the launcher must add it
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec = write_job(tmp_path / "job", data={"import": "userdata:digits", "eval_every": 20}, steps=40)
    plan = fp32_plan(spec, {"slow": {"1": "bf16", "3": "int8"}})
    result = run_job(spec, plan, metrics_dir=str(tmp_path / "m"), timeout_s=300)
    assert result.ok and result.steps_done == 40
    rows = list(csv.DictReader(open(tmp_path / "m" / "eval.csv")))
    assert [int(r["step"]) for r in rows] == [20, 40]
    assert all(int(r["test_samples"]) == 397 for r in rows)
    assert float(rows[-1]["test_accuracy"]) > 0.6  # ten classes: chance is 0.1
    last = json.loads((tmp_path / "m" / "eval.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 40 and last["test_accuracy"] == float(rows[-1]["test_accuracy"])
