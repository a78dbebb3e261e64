"""benchmarks/rollout.py refuses contradictory modes before running anything, naming the flags."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import rollout  # noqa: E402


@pytest.mark.parametrize("other", ["--skip-real", "--repack-only"])
def test_real_only_with_a_mode_that_excludes_it_exits_2(tmp_path, capsys, other):
    with pytest.raises(SystemExit) as e:
        rollout.main(["--out", str(tmp_path / "new"), "--real-only", other])
    assert e.value.code == 2
    assert "--real-only" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # nothing written, not even the folder


@pytest.mark.parametrize("flags, needle", [(["--trainer-micro-batches", "4"], "only with --real-only"),
                                           (["--real-only", "--trainer-micro-batches", "0"], "at least 1")])
def test_a_streaming_trainer_flag_it_cannot_take_exits_2(tmp_path, capsys, flags, needle):
    with pytest.raises(SystemExit) as e:
        rollout.main(["--out", str(tmp_path / "new"), *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--trainer-micro-batches" in err and needle in err
    assert not (tmp_path / "new").exists()


def test_repack_timing_row_names_each_call_over_its_limit_with_its_cpu():
    """Times are the caller's (call to return); a call over the limit is listed as wall/CPU ms, so a reader can tell
    a descheduled call (CPU under the limit) from one that did too much work; calls within it are not listed; what
    the caller waited past the decision's own clock (the collector resuming) is reported."""
    from types import SimpleNamespace

    last = SimpleNamespace(wall_s=0.051, freed=["w1"], objective=2.0, status="feasible", gap=None)
    decided = [0.039, 0.047, 0.049, 0.051]
    walls = [40.0, 52.0, 49.0, 51.5]
    row = rollout._timing_row(SimpleNamespace(tail_guard=False), "program", "scip", 0.05, last, decided, walls,
                              [39.0, 46.0, 48.0, 51.0], 1.0, frozen=True)
    assert row["over_limit"] == 2 and row["over_wall_cpu_ms"] == "52.0/46.0 51.5/51.0"
    assert row["cpu_ms_median"] == 47.0 and row["max_ms"] == 52.0 and row["gc_frozen"] is True
    assert row["after_decision_ms_max"] == pytest.approx(5.0)  # 52 ms seen by the caller, 47 ms decided
    assert row["calls"] == 4 and row["freed"] == 1 and row["vs_best_fit"] == 2.0
    best = rollout._timing_row(SimpleNamespace(tail_guard=False), "best-fit", "", "", last, decided, walls,
                               [1.0] * 4, 2.0)
    assert best["over_limit"] == "" and best["over_wall_cpu_ms"] == ""
