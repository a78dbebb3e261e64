"""The accuracy harness's verdict on the issue's targets, on hand-made summaries (no training)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from accuracy_summary import describe, summary, verdict  # noqa: E402


def _s(mean, std, ms=1.0):
    return {"n": 3, "mean": mean, "std": std, "ms": ms, "ind": 0.0, "t4": ""}


def test_a_gap_of_three_stds_counts_as_hurting_and_the_ilp_share_is_measured_from_uniform():
    v = verdict({"fp32": _s(97.0, 0.2, None), "uniform-lowest": _s(95.0, 0.5, 2.0), "ilp": _s(96.5, 0.4, 2.04),
                 "greedy": _s(96.0, 0.6), "qsync-greedy": _s(97.0, 0.1)})
    assert v["hurts"] and v["noise"] == 0.5 and v["gap"] == pytest.approx(2.0)
    assert v["recovered"] == pytest.approx(0.75) and v["time_ratio"] == pytest.approx(1.02)
    assert v["vs_greedy"] == (pytest.approx(0.5), 0.6)
    d, tol = v["vs_qsync-greedy"]
    assert d == pytest.approx(-0.5) and tol == 0.4 and "BEYOND noise 0.40" in describe(v)
    assert "greedy = +0.50 (within noise 0.60)" in describe(v)
    ahead = verdict({"fp32": _s(97.0, 0.2, None), "uniform-lowest": _s(95.0, 0.5, 2.0), "ilp": _s(96.5, 0.4, 2.04),
                     "qsync-greedy": _s(94.0, 0.1)})
    assert "ILP - qsync-greedy = +2.50 (ILP ahead beyond noise 0.40)" in describe(ahead)
    assert "time_ratio" not in verdict({"fp32": _s(97.0, 0.2, None), "uniform-lowest": _s(95.0, 0.5, None),
                                        "ilp": _s(96.5, 0.4)})


def test_a_gap_under_three_stds_does_not_hurt_and_missing_runs_say_so():
    v = verdict({"fp32": _s(97.0, 0.2), "uniform-lowest": _s(95.6, 0.5), "ilp": _s(96.5, 0.4)})
    assert not v["hurts"] and "does not lose 3x" in describe(v) and "recovers" not in describe(v)
    assert verdict({"fp32": _s(97.0, 0.2), "uniform-lowest": None, "ilp": _s(96.5, 0.4)}) is None
    assert describe(None) == "not enough finished runs"


def test_summary_reads_mean_and_std_per_policy_over_seeds():
    rows = [dict(task="cnn", cluster="c", setting="s", policy="ilp", test_accuracy=a, predicted_ms="1.5",
                 indicator="0.1", t4_precisions="int4:7") for a in ("0.9", "0.8", "")]
    s = summary(rows)[("cnn", "c", "s", "ilp")]
    assert s["n"] == 2 and s["mean"] == pytest.approx(85.0) and s["std"] == pytest.approx(7.0710678)
    assert s["ms"] == 1.5


def test_paired_differences_match_seeds_and_skip_unfinished_ones():
    from accuracy_summary import paired

    def row(policy, seed, acc):
        return dict(task="cnn", cluster="c", setting="s", policy=policy, seed=str(seed), test_accuracy=acc)

    rows = [row("ilp", 0, "0.95"), row("ilp", 1, "0.90"), row("ilp", 2, "0.99"),
            row("uniform-lowest", 1, "0.93"), row("uniform-lowest", 0, "0.94"), row("uniform-lowest", 2, "")]
    v = paired(rows, "ilp", "uniform-lowest")[("cnn", "c", "s")]
    assert v["n"] == 2 and v["diffs"] == [pytest.approx(1.0), pytest.approx(-3.0)]
    assert v["mean"] == pytest.approx(-1.0) and v["std"] == pytest.approx(2.8284271)
    assert paired(rows, "ilp", "fp32") == {}
