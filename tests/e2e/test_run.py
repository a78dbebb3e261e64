"""`qsync-opt run SPEC -o DIR`: solve -> train -> report, artefacts cached, --from restarts a stage."""

from __future__ import annotations

import json

import pytest

from qsync_opt.cli import main

pytestmark = pytest.mark.slow


def test_run_writes_the_report_and_reuses_its_artefacts(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "examples/cpu_tiny.yaml", "-o", str(out), "--steps", "3"]) == 0
    for f in ("plan.json", "report.md", "precisions.png", "timeline.png", "curves.png", "train/eval.csv"):
        assert (out / f).exists(), f
    report = (out / "report.md").read_text()
    assert "qsync greedy (QSync allocator)" in report and "Test set after step 3: accuracy" in report
    capsys.readouterr()
    plan_mtime = (out / "plan.json").stat().st_mtime
    assert main(["run", "examples/cpu_tiny.yaml", "-o", str(out), "--steps", "3", "--from", "report"]) == 0
    log = capsys.readouterr().out
    assert "[solve] cached" in log and "[train] cached" in log and "[report] running" in log
    assert (out / "plan.json").stat().st_mtime == plan_mtime
    assert json.loads((out / "run.json").read_text())["steps"] == 3


def test_run_from_an_unknown_stage_exits_2(tmp_path, capsys):
    assert main(["run", "examples/cpu_tiny.yaml", "-o", str(tmp_path), "--from", "sovle"]) == 2
    assert "--from 'sovle': not a stage; stages are solve, train, report" in capsys.readouterr().err
