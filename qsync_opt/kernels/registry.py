"""The public cached getters: spec -> loaded CPU module, loaded CUDA module (a torch extension, on a
CUDA build of torch), or compile-checked CUDA artefacts (nvcc only, for CI and the ctypes harness).

Lookup order: this process's memo, then the on-disk marker, then (under the directory's file
lock, after checking the marker again) a build. Render, build and cache stay in their own modules.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from qsync_opt.errors import KernelBuildError
from qsync_opt.kernels import build
from qsync_opt.kernels.cache import (cache_key, cache_root, compiler_version, entry_dir, file_lock, read_marker,
                                     toolchain, write_marker)
from qsync_opt.kernels.render import render_cpu, render_cuda
from qsync_opt.kernels.spec import CpuSpec, CudaSpec

_MEMO: dict = {}  # entry directory -> CpuModule, and (spec, root, compiler) -> CpuModule (skips rendering)
_MEMO_LOCK = threading.Lock()


@dataclass(frozen=True)
class CpuModule:
    """A loaded CPU kernel module; its ops are torch.ops.<namespace>.<op>."""

    spec: CpuSpec
    namespace: str
    path: Path
    key: str
    built: bool
    """True only for the call that compiled it; False for a cache hit (memory or disk)."""

    @property
    def ops(self):
        return getattr(torch.ops, self.namespace)


@dataclass(frozen=True)
class CudaModule:
    """A loaded CUDA kernel module (torch extension); its ops are torch.ops.<namespace>_cuda.<op>,
    each taking the CUDA stream as its last argument."""

    spec: CudaSpec
    namespace: str
    path: Path
    key: str
    built: bool

    @property
    def ops(self):
        return getattr(torch.ops, f"{self.namespace}_cuda")


@dataclass(frozen=True)
class CudaArtefacts:
    """Rendered CUDA sources and what was compiled from them in `directory`."""

    spec: CudaSpec
    directory: Path
    source: Path
    binding: Path
    output: Path
    key: str
    built: bool


def _lookup_or_build(directory: Path, key: str, build_fn) -> tuple[dict, bool]:
    marker = read_marker(directory, key)
    if marker is not None:
        return marker, False
    with file_lock(directory):
        marker = read_marker(directory, key)  # another process may have finished it while we waited
        if marker is not None:
            return marker, False
        marker = {"key": key, **build_fn()}
        write_marker(directory, marker)
        return marker, True


def _build_and_load(module_type, spec, rendered, directory: Path, key: str, tc: dict, quick, build_library):
    """The disk cache (marker + lock) under the in-memory memo: build once per content and
    toolchain, load a library another process built, and memoise it under both keys."""
    with _MEMO_LOCK:
        hit = _MEMO.get(str(directory))
        if hit is not None:
            _MEMO[quick] = hit
            return hit
        loaded_by_build = []

        def do_build() -> dict:
            path = build_library()  # builds and loads it into torch.ops
            loaded_by_build.append(path)
            return {"artefact": path.name, "namespace": rendered.namespace, "toolchain": tc, "spec": repr(spec)}

        marker, built = _lookup_or_build(directory, key, do_build)
        path = directory / marker["artefact"]
        if not loaded_by_build:
            build.load_library(path)
        mod = module_type(spec=spec, namespace=marker["namespace"], path=path, key=key, built=built)
        _MEMO[str(directory)] = _MEMO[quick] = dataclasses.replace(mod, built=False)
        return mod


def get_cpu_module(spec: CpuSpec | None = None, *, cache_dir=None) -> CpuModule:
    """Render, build (once per content and toolchain) and load the CPU ops of `spec`."""
    spec = spec or CpuSpec()
    root = cache_root(cache_dir)
    quick = (spec, str(root), build.cxx())
    hit = _MEMO.get(quick)
    if hit is not None:  # the per-call fast path: no rendering, no hashing (stored with built=False)
        return hit
    rendered = render_cpu(spec, salt=str(root.resolve()))
    flags = build.cpu_flags(spec.march)
    tc = toolchain("cpu", flags, build.cxx())
    key = cache_key(rendered.digest(), tc)
    directory = entry_dir(root, spec.name, key)
    return _build_and_load(
        CpuModule, spec, rendered, directory, key, tc, quick,
        lambda: build.build_cpu(rendered, directory, f"{spec.name}_{key[:12]}", flags))


def compile_cuda(spec: CudaSpec, *, cache_dir=None, mode: str = "object", check_binding: bool = True) -> CudaArtefacts:
    """nvcc-compile `spec`'s kernels for its arch (mode 'cubin', 'object' or 'shared'; see
    build.compile_cuda) and syntax-check its torch binding; cached like the CPU build."""
    rendered = render_cuda(spec)
    flags = build.nvcc_flags(spec.arch) + build.CUDA_MODES.get(mode, [mode]) + (["binding"] if check_binding else [])
    tc = toolchain(spec.arch, flags, build.nvcc() or "nvcc")
    if check_binding:
        tc["cxx"] = compiler_version(build.cxx())
    key = cache_key(rendered.digest(), tc)
    directory = entry_dir(cache_root(cache_dir), f"{spec.name}_{mode}", key)
    out_name = f"{spec.name}.{ {'cubin': 'cubin', 'object': 'o', 'shared': 'so'}.get(mode, 'out') }"

    def do_build() -> dict:
        (source,) = build.write_sources(rendered, directory)
        build.compile_cuda(source, directory / out_name, spec.arch, mode=mode)
        if check_binding:
            build.syntax_check_binding(directory / rendered.binding)
        return {"artefact": out_name, "namespace": rendered.namespace, "toolchain": tc, "spec": repr(spec)}

    marker, built = _lookup_or_build(directory, key, do_build)
    return CudaArtefacts(spec=spec, directory=directory, source=directory / rendered.main,
                         binding=directory / rendered.binding, output=directory / marker["artefact"], key=key,
                         built=built)


def get_cuda_module(spec: CudaSpec, *, cache_dir=None) -> CudaModule:
    """Render, build (once per content and toolchain, with torch.utils.cpp_extension) and load the
    CUDA ops of `spec`; cached on disk and in memory like the CPU module. Needs a CUDA torch."""
    if torch.version.cuda is None:
        raise KernelBuildError(f"the CUDA kernels need a CUDA build of torch; this one is {torch.__version__}")
    root = cache_root(cache_dir)
    quick = ("cuda", spec, str(root))
    hit = _MEMO.get(quick)
    if hit is not None:
        return hit
    rendered = render_cuda(spec)
    flags = build.nvcc_flags(spec.arch) + build.cuda_gencode(spec.arch) + ["torch-extension"]
    tc = toolchain(spec.arch, flags, build.nvcc() or "nvcc")
    tc["cxx"], tc["cuda"] = compiler_version(build.cxx()), str(torch.version.cuda)
    key = cache_key(rendered.digest(), tc)
    directory = entry_dir(root, f"{spec.name}_ext", key)
    return _build_and_load(
        CudaModule, spec, rendered, directory, key, tc, quick,
        lambda: build.build_cuda_extension(rendered, directory, f"{spec.name}_{key[:12]}", spec.arch))
