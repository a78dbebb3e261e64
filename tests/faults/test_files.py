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
