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
