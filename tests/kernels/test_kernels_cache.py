"""Render, cache and build layers: readable names, content keys, hits without rebuilds, locks, errors."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

from qsync_opt.errors import KernelBuildError, SpecError
from qsync_opt.kernels import build, cache, registry
from qsync_opt.kernels.render import Rendered, render_cpu
from qsync_opt.kernels.spec import CpuSpec

SMALL = CpuSpec(in_dtypes=("fp32",), out_dtypes=("fp32",), grain=4096)


def test_rendered_source_carries_the_parameters():
    r = render_cpu(SMALL)
    src = r.files[r.main]
    assert r.name == "qsync_cpu_in_fp32_out_fp32_g4096_r0_native"
    assert "TypeList<float>" in src and "kGrain = 4096" in src and f"TORCH_LIBRARY({r.namespace}" in src
    assert "qsync_cpu_kernels.h" in r.files  # headers travel with the source, so they are in the key


def test_changed_parameters_change_name_digest_and_namespace():
    a, b = render_cpu(SMALL), render_cpu(CpuSpec(in_dtypes=("fp32",), out_dtypes=("fp32",), grain=8192))
    assert a.name != b.name and a.digest() != b.digest() and a.namespace != b.namespace
    assert render_cpu(SMALL).digest() == a.digest()  # rendering is deterministic


def test_key_covers_toolchain_and_isa():
    d = render_cpu(SMALL).digest()
    native = cache.toolchain("cpu", build.cpu_flags("native"), build.cxx())
    portable = cache.toolchain("cpu", build.cpu_flags("x86-64-v3"), build.cxx())
    assert "isa" in native and "isa" not in portable
    assert native["torch"] == torch.__version__
    assert cache.cache_key(d, native) != cache.cache_key(d, portable)


def test_spec_validation_names_the_field():
    with pytest.raises(SpecError, match="CpuSpec.in_dtypes: unknown dtype name"):
        CpuSpec(in_dtypes=("fp64",))
    with pytest.raises(SpecError, match="CpuSpec.out_dtypes"):
        CpuSpec(out_dtypes=("fp16",))
    with pytest.raises(SpecError, match="CpuSpec.grain: 0"):
        CpuSpec(grain=0)


def test_write_if_changed_leaves_equal_files_alone(tmp_path):
    p = tmp_path / "a.cpp"
    assert cache.write_if_changed(p, "int x;")
    before = p.stat().st_mtime_ns
    assert not cache.write_if_changed(p, "int x;")
    assert p.stat().st_mtime_ns == before
    assert cache.write_if_changed(p, "int y;") and p.read_text() == "int y;"


def test_cache_root_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("QSYNC_OPT_CACHE", str(tmp_path))
    assert cache.cache_root() == tmp_path
    monkeypatch.delenv("QSYNC_OPT_CACHE")
    assert cache.cache_root().parts[-3:] == (".cache", "qsync_opt", "kernels")


def test_file_lock_excludes_a_second_holder(tmp_path):
    """No timing: while the lock is held, a second holder's non-blocking attempt on the same lock file
    is refused (flock locks belong to an open file, so a second open() in this process competes like
    another process); a blocked second holder gets in once the first lets go."""
    import fcntl

    def try_lock() -> bool:
        with open(tmp_path / ".lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
            return True

    order, done = [], threading.Event()

    def second():
        with cache.file_lock(tmp_path):
            order.append("second")
        done.set()

    with cache.file_lock(tmp_path):
        assert not try_lock()
        t = threading.Thread(target=second)
        t.start()
        assert not done.is_set() and not try_lock()  # still ours, whatever the thread is doing
        order.append("first")
    assert done.wait(timeout=60)  # a hang detector, not a timing check
    t.join()
    assert order == ["first", "second"]
    assert try_lock()  # released


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    """One empty cache root for the build tests of this file (each build costs 10-20 s)."""
    return tmp_path_factory.mktemp("kernel_cache")


@pytest.fixture()
def fresh_cache(module_cache, monkeypatch):
    monkeypatch.setattr(registry, "_MEMO", {})  # forget in-process hits; the disk cache stays
    return module_cache


def test_build_once_then_hit_in_memory_on_disk_and_in_another_process(fresh_cache):
    first = registry.get_cpu_module(SMALL, cache_dir=fresh_cache)  # the first test to build SMALL here
    assert first.built and first.path.exists() and first.path.parent.name.startswith(SMALL.name)
    x = torch.randn(50, 3)
    assert torch.equal(first.ops.quantize(x, None, 127, None, False, 0)[0],
                       torch.round(x / (x.abs().max() / 127)).to(torch.int8))
    mtime = first.path.stat().st_mtime_ns

    assert not registry.get_cpu_module(SMALL, cache_dir=fresh_cache).built  # memory hit
    registry._MEMO.clear()
    again = registry.get_cpu_module(SMALL, cache_dir=fresh_cache)  # disk hit: marker, no compiler
    assert not again.built and again.path == first.path and again.path.stat().st_mtime_ns == mtime

    code = ("import sys; from qsync_opt.kernels.registry import get_cpu_module; from qsync_opt.kernels.spec import CpuSpec;"
            f"m = get_cpu_module(CpuSpec(in_dtypes=('fp32',), out_dtypes=('fp32',), grain=4096), cache_dir={str(fresh_cache)!r});"
            "sys.exit(10 + m.built)")
    rc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ)).returncode
    assert rc == 10  # loaded, not built


@pytest.mark.slow
def test_changed_parameters_build_a_new_module(fresh_cache):
    a = registry.get_cpu_module(SMALL, cache_dir=fresh_cache)
    other = CpuSpec(in_dtypes=("fp32",), out_dtypes=("fp32",), grain=4096, linear_rows=64)
    b = registry.get_cpu_module(other, cache_dir=fresh_cache)
    assert b.built and b.path.parent != a.path.parent and b.namespace != a.namespace
    # |codes| ≤ 63: no pair of u8 x s8 products reaches int16's limit, so oneDNN is exact on every x86 ISA
    xq = torch.randint(-63, 64, (200, 40), dtype=torch.int8)
    wq = torch.randint(-63, 64, (30, 40), dtype=torch.int8)
    one = torch.tensor(1.0)
    expected = (xq.long() @ wq.long().T).float()
    for mod in (a, b):  # both modules live side by side in one process
        assert torch.equal(mod.ops.int8_linear(xq, one, wq, one, None, torch.float32), expected)


def test_failed_build_raises_with_the_compiler_output(tmp_path):
    broken = Rendered(name="qsync_broken", files={"broken.cpp": "int f() { return undeclared_qsync_symbol; }\n"},
                      main="broken.cpp", namespace="qsync_broken")
    with pytest.raises(KernelBuildError) as err:
        build.build_cpu(broken, tmp_path / "broken", "qsync_broken_module", build.cpu_flags("native"))
    text = str(err.value)
    assert "undeclared_qsync_symbol" in text and "error" in text and "qsync_broken_module" in text


def test_ops_raise_for_templated_and_fall_back_for_auto_when_the_build_fails(tmp_path, monkeypatch):
    from qsync_opt.kernels import ops

    monkeypatch.setenv("QSYNC_OPT_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(registry, "_MEMO", {})
    monkeypatch.setattr(ops, "_auto_failure", None)
    x = torch.randn(30, 4)
    with pytest.raises(KernelBuildError, match="building CPU kernel module"):
        ops.quantize_symmetric(x, impl="templated")
    assert not ops.available("templated") and ops.available("torch")
    with pytest.warns(RuntimeWarning, match="using the torch path"):
        q, s = ops.quantize_symmetric(x)  # auto: falls back, once, with the compiler's complaint
    assert torch.equal(q, ops.quantize_symmetric(x, impl="torch")[0])
