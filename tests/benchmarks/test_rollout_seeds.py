"""benchmarks/rollout_seeds.py refuses an unknown case by name, before simulating anything."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import rollout_seeds  # noqa: E402


def test_an_unknown_case_exits_2_naming_it_and_the_choices(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        rollout_seeds.main(["--out", str(tmp_path), "--cases", "a100x640"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--cases: a100x640 unknown" in err and "a100x64+l4x64" in err
    assert not (tmp_path / "rollout_seeds.csv").exists()
