"""benchmarks/rollout_ceilings.py: every policy of a case against the ceiling of its own run and the long-run one."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import rollout_ceilings as rc  # noqa: E402
from benchmarks.rollout import case_job  # noqa: E402
from qsync_opt.rollout.bounds import ceiling  # noqa: E402
from qsync_opt.rollout.bounds_staleness import staleness_ceiling  # noqa: E402
from qsync_opt.rollout.simulate import VARIANTS, simulate  # noqa: E402


def test_each_policy_lies_under_its_run_ceiling_and_the_csv_says_so(tmp_path, capsys):
    assert rc.main(["--out", str(tmp_path), "--cases", "h100x128", "--sim-steps", "1"]) == 0
    text = (tmp_path / "rollout_ceilings.csv").read_text()
    assert text.startswith("# command: python benchmarks/rollout_ceilings.py --out")
    rows = list(csv.DictReader(ln for ln in text.splitlines() if not ln.startswith("#")))
    assert [r["policy"] for r in rows] == list(VARIANTS)
    job = case_job("h100x128", 1)
    c = staleness_ceiling(job)
    for r in rows:
        assert float(r["of_run_ceiling"]) <= 1.0
        assert float(r["ceiling_tps"]) == pytest.approx(c.tps, rel=1e-4)
        assert float(r["ceiling_without_rule_tps"]) == pytest.approx(ceiling(job).tps, rel=1e-4)
        assert float(r["ceiling_tps"]) <= float(r["ceiling_without_rule_tps"])
        assert r["bound_by"] == c.bound_by
    sync = simulate(job, "sync")
    assert float(rows[0]["trajectories_per_s"]) == pytest.approx(sync.trajectories_per_s, rel=1e-4)
    out = capsys.readouterr().out
    assert "best policy:" in out and "best other asynchronous" in out and ("rules out 1.3x" in out or "leaves room for 1.3x" in out)


def test_an_unknown_case_is_named():
    with pytest.raises(SystemExit) as e:
        rc.main(["--out", "/nonexistent-never-written", "--cases", "a100x65"])
    assert e.value.code == 2


def test_a_streaming_trainer_writes_its_own_table_with_its_ceilings(tmp_path):
    assert rc.main(["--out", str(tmp_path), "--cases", "h100x128", "--sim-steps", "1", "--variants", "sync",
                    "--trainer-micro-batches", "4"]) == 0
    assert not (tmp_path / "rollout_ceilings.csv").exists()
    text = (tmp_path / "rollout_ceilings_streaming.csv").read_text()
    rows = list(csv.DictReader(ln for ln in text.splitlines() if not ln.startswith("#")))
    assert {r["trainer_micro_batches"] for r in rows} == {"4"}
    job = rc._job("h100x128", 1, 1, micro_batches=4)
    assert job.rollout.trainer_micro_batches == 4
    for r in rows:
        assert float(r["of_run_ceiling"]) <= 1.0
        assert float(r["ceiling_tps"]) == pytest.approx(staleness_ceiling(job).tps, rel=1e-4)


def test_a_micro_batch_count_below_one_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        rc.main(["--out", str(tmp_path / "new"), "--trainer-micro-batches", "0"])
    assert e.value.code == 2 and "--trainer-micro-batches 0" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
