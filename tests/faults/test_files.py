"""Written files: atomic, with the permissions a team expects (umask for new files, mode kept on overwrite)."""

from __future__ import annotations

import os
import stat

import pytest

from qsync_opt.io import atomic_write_bytes, atomic_write_text


def mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_new_file_gets_the_umask_mode_not_0600(tmp_path, umask):
    p = atomic_write_text(tmp_path / "plan.json", "{}")
    assert mode(p) == 0o644
    os.umask(0o077)
    assert mode(atomic_write_text(tmp_path / "private.json", "{}")) == 0o600


def test_overwriting_keeps_the_existing_mode(tmp_path, umask):
    """The issue's case: overwriting a 0644 plan made it 0600, unreadable to the rest of a team."""
    p = tmp_path / "plan.json"
    p.write_text("old")
    os.chmod(p, 0o664)
    atomic_write_text(p, "new")
    assert mode(p) == 0o664 and p.read_text() == "new"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text("old")
    with pytest.raises(TypeError):
        atomic_write_bytes(p, object())  # fails while writing the temporary
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["plan.json"]


def test_exported_problems_and_benchmark_tables_are_readable_by_the_team(tmp_path, umask):
    """Problem files and the kernel bench's CSVs once went through private mkstemp copies (0600)."""
    import sys
    from pathlib import Path

    from qsync_opt.solver import files
    from qsync_opt.training.program.random_instances import random_small
    from qsync_opt.training.program.compile import compile_training

    p = compile_training(random_small(0))
    files.save_problem(p, str(tmp_path / "p.mps"))  # writes p.mps and its twin p.json
    assert mode(tmp_path / "p.mps") == 0o644 and mode(tmp_path / "p.json") == 0o644
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from kernel_speed import write_csv
    finally:
        sys.path.pop(0)
    write_csv(tmp_path / "k.csv", [{"a": 1}])
    assert mode(tmp_path / "k.csv") == 0o644 and (tmp_path / "k.csv").read_bytes() == b"a\r\n1\r\n"
