"""Suite-wide: measured profiles and indicator caches go to a fresh folder per session, so a
profile a developer made on this machine never changes what a test plans (kernels keep the
user's build cache: they are keyed by their sources and toolchain)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_profile_cache(tmp_path_factory):
    old = os.environ.get("QSYNC_OPT_PROFILE_DIR")
    os.environ["QSYNC_OPT_PROFILE_DIR"] = str(tmp_path_factory.mktemp("profiles"))
    yield
    if old is None:
        os.environ.pop("QSYNC_OPT_PROFILE_DIR", None)
    else:
        os.environ["QSYNC_OPT_PROFILE_DIR"] = old
