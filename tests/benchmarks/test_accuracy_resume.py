"""--resume reuses a finished training only when it trained the plan planned now."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from accuracy import same_plan  # noqa: E402


def committed_rows():
    lines = [x for x in (ROOT / "benchmarks/results/accuracy_vit_5pct.csv").read_text().splitlines() if not x.startswith("#")]
    return list(csv.DictReader(lines))


def planned(old: dict, **change) -> dict:
    """The row `main` builds for a plan (predicted_ms a float, the rest strings as written), with changes."""
    row = dict(t4_precisions=old["t4_precisions"], local_batches=old["local_batches"],
               predicted_ms=float(old["predicted_ms"]) if old["predicted_ms"] else None)
    row.update(change)
    return row


def test_a_committed_row_resumes_against_its_own_plan():
    for old in committed_rows():
        assert same_plan(old, planned(old)), old["policy"]


def test_a_changed_map_batch_or_time_is_trained_again():
    old = next(r for r in committed_rows() if r["policy"] == "ilp")
    assert not same_plan(old, planned(old, t4_precisions="int4:9 int8:5"))
    assert not same_plan(old, planned(old, local_batches='{"strong": 1, "t4": 2}'))
    assert not same_plan(old, planned(old, predicted_ms=float(old["predicted_ms"]) * 1.001))
