"""benchmarks/rollout_plan_time.py on the tiny spec: both modes timed, their figures compared, the CSV written."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import rollout_plan_time  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_both_modes_give_the_same_figures_and_a_row_each(tmp_path, monkeypatch):
    import qsync_opt.rollout.plan as plan

    monkeypatch.setattr(plan, "PARALLEL_AFTER_S", 0.0)  # the tiny spec is fast: use the workers anyway
    monkeypatch.setattr(rollout_plan_time.os, "sched_getaffinity", lambda pid: {0, 1})  # 2 CPUs on any machine
    rc = rollout_plan_time.main(["--out", str(tmp_path), "--spec", str(ROOT / "examples/rollout_cpu_tiny.yaml"),
                                 "--reps", "1"])
    assert rc == 0
    text = (tmp_path / "rollout_plan_time.csv").read_text()
    assert text.startswith("# command: python benchmarks/rollout_plan_time.py")
    rows = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    assert [(r["mode"], r["processes"], r["same_figures"]) for r in rows] == [("serial", "1", "True"),
                                                                            ("workers", "2", "True")]
