"""`data.eval_groups`: each group's first rank evaluates the network as it runs it (its formats)."""

from __future__ import annotations

import csv

from data_jobs import fp32_plan, write_job

from qsync_opt.data.evaluation import Evaluator, evaluate, read_eval
from qsync_opt.data.task import build_task
from qsync_opt.training.plan import Plan
from qsync_opt.training.runtime.trainer import build_rank_model
from qsync_opt.training.spec import load_spec


def _setup(tmp_path, monkeypatch, eval_groups: bool):
    monkeypatch.syspath_prepend(str(tmp_path / "job"))  # the launcher does this for its workers
    path = write_job(tmp_path / "job", data={"import": "userdata:digits", "eval_groups": eval_groups}, steps=3)
    plan = Plan.load(fp32_plan(path, {"slow": {"1": "int4", "3": "int4"}}))
    spec = load_spec(path)
    return spec, plan, build_task(spec)


def test_the_weak_groups_first_rank_logs_its_quantized_forward_and_rank0_the_master_weights(tmp_path, monkeypatch):
    spec, plan, task = _setup(tmp_path, monkeypatch, True)
    weak = build_rank_model(spec, plan, "slow")
    strong = build_rank_model(spec, plan, "fast")
    folder = tmp_path / "m"
    # rank 1 is the slow group's first (and only) rank: it logs eval_slow, not the master log
    assert Evaluator(spec, task, folder, 1, total_steps=3).after_step(3, 0.5, weak) is None
    master = Evaluator(spec, task, folder, 0, total_steps=3).after_step(3, 0.5, strong)
    as_weak = read_eval(folder, "eval_slow")
    assert [r["step"] for r in as_weak] == [3]
    # the weak record is the quantized model's own accuracy; same weights in fp32 give the master's
    assert as_weak[0]["test_accuracy"] == evaluate(weak, task)["test_accuracy"]
    assert master["test_accuracy"] == evaluate(strong, task)["test_accuracy"]
    assert as_weak[0]["test_loss"] != master["test_loss"]  # int4 forward differs from the fp32 one
    rows = list(csv.DictReader(open(folder / "eval_fast.csv")))  # rank 0 is also the fast group's first rank
    assert [int(r["step"]) for r in rows] == [3]


def test_without_eval_groups_only_rank0_evaluates(tmp_path, monkeypatch):
    spec, plan, task = _setup(tmp_path, monkeypatch, False)
    weak = build_rank_model(spec, plan, "slow")
    ev = Evaluator(spec, task, tmp_path / "m", 1, total_steps=3)
    assert not ev.due(3) and ev.after_step(3, 0.5, weak) is None
    assert not (tmp_path / "m").exists()


def test_eval_start_skips_the_early_periodic_evaluations_but_never_the_last(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path / "job"))
    path = write_job(tmp_path / "job", data={"import": "userdata:digits", "eval_every": 10, "eval_start": 15}, steps=25)
    spec = load_spec(path)
    ev = Evaluator(spec, build_task(spec), None, 0, total_steps=25)
    assert [s for s in range(1, 26) if ev.due(s)] == [20, 25]
