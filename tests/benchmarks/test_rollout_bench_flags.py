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


def test_repack_timing_row_names_each_call_over_its_limit_with_its_cpu():
    """A call over the limit is listed as wall/CPU ms, so a reader can tell a descheduled call (CPU under the
    limit) from one that did too much work; calls within it are not listed."""
    from types import SimpleNamespace

    rs = [SimpleNamespace(wall_s=w, freed=["w1"], objective=2.0, status="feasible", gap=None)
          for w in (0.040, 0.052, 0.049, 0.0515)]
    row = rollout._timing_row(SimpleNamespace(tail_guard=False), "program", "scip", 0.05, rs,
                              [39.0, 46.0, 48.0, 51.0], rs[-1], 1.0)
    assert row["over_limit"] == 2 and row["over_wall_cpu_ms"] == "52.0/46.0 51.5/51.0"
    assert row["cpu_ms_median"] == 47.0 and row["max_ms"] == 52.0
    best = rollout._timing_row(SimpleNamespace(tail_guard=False), "best-fit", "", "", rs, [1.0] * 4, rs[0], 2.0)
    assert best["over_limit"] == "" and best["over_wall_cpu_ms"] == ""
