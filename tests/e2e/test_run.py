"""`qsync-opt run`: profile -> indicate -> solve -> predict -> train -> report, artefacts cached, --from restarts a stage."""

from __future__ import annotations

import json

import pytest

from qsync_opt.cli.commands import main

pytestmark = pytest.mark.slow

STAGES = ("profile", "indicate", "solve", "predict", "train", "report")


@pytest.fixture
def quick_cache(tmp_path, monkeypatch):
    """A fresh profile/indicator cache, so the profile stage really measures; the profiler's
    own options keep it short (one block of one repeat per op)."""
    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("QSYNC_OPT_PROFILE_BLOCKS", "1")
    monkeypatch.setenv("QSYNC_OPT_PROFILE_REPEATS", "1")
    return tmp_path / "cache"


def test_run_writes_the_report_and_reuses_its_artefacts(tmp_path, capsys, quick_cache):
    out = tmp_path / "run"
    assert main(["run", "examples/cpu_tiny.yaml", "-o", str(out), "--steps", "3"]) == 0
    for f in ("profile.json", "indicator.json", "plan.json", "predict.json", "timeline.png", "timeline.trace.json",
              "report.md", "precisions.png", "curves.png", "train/eval.csv", "train/load.json"):
        assert (out / f).exists(), f
    log = capsys.readouterr().out
    assert all(f"[{s}] running" in log for s in STAGES), log

    prof = json.loads((out / "profile.json").read_text())
    assert set(prof["profiled"]) == {"native", "sse41"}, prof  # both CPU groups run here; the cache was empty
    assert list(quick_cache.glob("profile-*.json")) == [__import__("pathlib").Path(prof["profile"])]
    pred = json.loads((out / "predict.json").read_text())
    assert set(pred["groups"]) == {"native", "sse41"} and pred["iteration_ms"] > 0
    assert all(g["costs"].startswith("measured") for g in pred["groups"].values()), pred["groups"]
    trace = json.loads((out / "timeline.trace.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    assert json.loads((out / "indicator.json").read_text())["omega"]

    report = (out / "report.md").read_text()
    assert "qsync greedy (QSync allocator)" in report and "Test set after step 3 (1,024 samples): accuracy" in report
    assert "| predicted (replayer; costs measured) |" in report and "| measured (train: median of 2 steps" in report
    assert "![predicted timeline](timeline.png)" in report

    # --from predict: profile, indicate and solve are reused untouched; predict onwards run again
    kept = {f: (out / f).stat().st_mtime_ns for f in ("profile.json", "indicator.json", "plan.json")}
    redone = (out / "predict.json").stat().st_mtime_ns
    assert main(["run", "examples/cpu_tiny.yaml", "-o", str(out), "--steps", "3", "--from", "predict"]) == 0
    log = capsys.readouterr().out
    for s in ("profile", "indicate", "solve"):
        assert f"[{s}] cached" in log and f"[{s}] running" not in log, log
    for s in ("predict", "train", "report"):
        assert f"[{s}] running" in log, log
    assert {f: (out / f).stat().st_mtime_ns for f in kept} == kept
    assert (out / "predict.json").stat().st_mtime_ns != redone
    assert json.loads((out / "run.json").read_text())["steps"] == 3

    # a second run in a new folder finds this machine's profile complete and measures nothing
    out2 = tmp_path / "run2"
    assert main(["run", "examples/cpu_tiny.yaml", "-o", str(out2), "--steps", "2"]) == 0
    prof2 = json.loads((out2 / "profile.json").read_text())
    assert prof2["profiled"] == {} and set(prof2["skipped"]) == {"native", "sse41"}
    assert all(why.startswith("measured in") for why in prof2["skipped"].values()), prof2


def test_run_from_an_unknown_stage_exits_2(tmp_path, capsys):
    assert main(["run", "examples/cpu_tiny.yaml", "-o", str(tmp_path), "--from", "sovle"]) == 2
    assert "--from 'sovle': not a stage; stages are profile, indicate, solve, predict, train, report" in capsys.readouterr().err
