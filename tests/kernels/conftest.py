"""Shared fixtures: one CPU kernel build per session (the on-disk cache makes later sessions instant)."""

from __future__ import annotations

import shutil

import pytest

from qsync_opt.errors import KernelBuildError


@pytest.fixture(scope="session")
def cpu_module():
    """The default CPU kernel module, built into the user cache ($QSYNC_OPT_CACHE or ~/.cache)."""
    from qsync_opt.kernels import build
    from qsync_opt.kernels.registry import get_cpu_module

    if shutil.which(build.cxx()) is None:
        pytest.skip(f"no C++ compiler ({build.cxx()}) on PATH: the templated CPU kernels cannot build here")
    try:
        return get_cpu_module()
    except KernelBuildError as e:  # a real failure: show the compiler output
        pytest.fail(str(e))


@pytest.fixture(params=["templated", "torch"])
def impl(request):
    """Each test that takes `impl` runs on both paths; the templated one needs the session build."""
    if request.param == "templated":
        request.getfixturevalue("cpu_module")
        from qsync_opt.kernels import reference

        if getattr(request.module, "INT8_GEMM", False) and not reference.cpu_int_mm_exact():
            pytest.skip("oneDNN's int8 GEMM is not exact on this CPU (no VNNI): impl='templated' refuses it "
                        "(tests/kernels/test_int8_exactness.py)")
    return request.param
