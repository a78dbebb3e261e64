"""benchmarks/results_table.py: every rollout results CSV carries its command and load, and a failed write leaves the
previous file as it was."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.results_table import write_table  # noqa: E402


def test_header_lines_then_the_table_with_missing_keys_empty(tmp_path):
    path = write_table(tmp_path / "sub" / "t.csv", "demo.py", ["--out", "x"], ["a", "b"], [{"a": 1}, {"a": 2, "b": "y"}], 0.5)
    text = path.read_text()
    lines = text.split("\n")
    assert lines[0] == "# command: python benchmarks/demo.py --out x"
    assert lines[1].startswith("# load (1 min) 0.50 -> ") and " CPUs; " in lines[1] and lines[1].endswith(" UTC")
    assert "\r" not in text  # one line ending throughout (csv's default would write \r\n under \n comment lines)
    assert list(csv.DictReader(lines[2:])) == [{"a": "1", "b": ""}, {"a": "2", "b": "y"}]


def test_a_row_with_an_unknown_column_raises_and_keeps_the_previous_file(tmp_path):
    path = tmp_path / "t.csv"
    write_table(path, "demo.py", [], ["a"], [{"a": 1}], 0.0)
    before = path.read_text()
    with pytest.raises(ValueError, match="zzz"):
        write_table(path, "demo.py", [], ["a"], [{"a": 2}, {"zzz": 3}], 0.0)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]  # no temporary file left behind
