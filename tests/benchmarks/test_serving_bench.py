"""benchmarks/serving.py, the command behind the README's serving figures, reproduces the committed
benchmarks/results/serving.csv: the same plans and baselines, the same predicted figures (solve times aside)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import serving  # noqa: E402

FIGURES = ("tokens_per_s", "ratio_vs_best_baseline", "e2e_s", "quality", "quality_bound", "bound_from", "shape", "status")


def rows(path: Path) -> dict[tuple, dict]:
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    return {(r["case"], r["policy"], r["backend"]): r for r in csv.DictReader(lines)}


@pytest.mark.slow
def test_cases_1_and_3_reproduce_the_committed_figures(tmp_path):
    assert serving.main(["--out", str(tmp_path), "--cases", "1,3", "--backends", "highs", "--limit", "30"]) == 0
    new = rows(tmp_path / "serving.csv")
    old = {k: r for k, r in rows(ROOT / "benchmarks" / "results" / "serving.csv").items()
           if k[0] in ("1", "3") and k[2] in ("highs", "-")}  # HiGHS's plans and the baselines
    assert set(new) == set(old)
    assert {k: {f: new[k][f] for f in FIGURES} for k in new} == {k: {f: old[k][f] for f in FIGURES} for k in old}
