"""Build-and-load: rendered files in a directory -> a compiled artefact, or KernelBuildError.

CPU: torch.utils.cpp_extension.load (ninja) into a shared library that registers torch ops.
CUDA: nvcc -c per architecture (a compile check, or -shared for the ctypes harness), and a
syntax-only compile of the torch binding against this torch's headers.
Nothing here decides *whether* to build; registry.py does, under a lock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch

from qsync_opt.errors import KernelBuildError
from qsync_opt.kernels.cache import write_if_changed
from qsync_opt.kernels.render import Rendered


def cxx() -> str:
    """The C++ compiler torch.utils.cpp_extension uses."""
    return os.environ.get("CXX", "c++")


def cpu_flags(march: str) -> list[str]:
    # -ffp-contract=off: the epilogue must round after the multiply, as torch's reference does.
    # -fno-trapping-math lets floor() vectorise (values unchanged; torch itself is built with it).
    return ["-O3", f"-march={march}", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fopenmp",
            "-DNDEBUG"]


CPU_LDFLAGS = ["-fopenmp"]  # resolves to the libgomp.so.1 torch has already loaded


def nvcc_flags(arch: str) -> list[str]:
    return ["-O3", "-std=c++17", f"-arch={arch}", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC"]


def write_sources(rendered: Rendered, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    for fname, text in rendered.files.items():
        write_if_changed(directory / fname, text)
    return [directory / rendered.main]


def _with_ninja_on_path() -> dict:
    """os.environ with the running interpreter's bin dir (where the venv's ninja is) on PATH."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    if shutil.which("ninja") is None and bindir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def build_cpu(rendered: Rendered, directory: Path, module: str, flags: list[str]) -> Path:
    """Compile `rendered` in `directory` as shared library `module`.so and load it into torch.ops."""
    sources = write_sources(rendered, directory)
    return _load_extension(
        f"building CPU kernel module {module} failed (sources in {directory})",
        name=module, sources=[str(s) for s in sources], extra_cflags=flags, extra_ldflags=CPU_LDFLAGS,
        extra_include_paths=[str(directory)], build_directory=str(directory))


def cuda_gencode(arch: str) -> list[str]:
    """SASS for `arch` plus its PTX, so a newer GPU than any tiles.yaml arch JIT-compiles the kernels."""
    sm = arch.split("_")[1]
    return [f"-gencode=arch=compute_{sm},code=[sm_{sm},compute_{sm}]"]


def build_cuda_extension(rendered: Rendered, directory: Path, module: str, arch: str) -> Path:
    """Compile the rendered .cu and its torch binding into one library with torch.utils.cpp_extension
    (needs a CUDA build of torch and nvcc) and load it: its ops appear under torch.ops.<namespace>_cuda."""
    write_sources(rendered, directory)
    return _load_extension(
        f"building CUDA kernel module {module} for {arch} failed (sources in {directory})",
        name=module, sources=[str(directory / rendered.binding), str(directory / rendered.main)],
        extra_cflags=["-O3", "-DNDEBUG"], extra_cuda_cflags=["-O3", "--expt-relaxed-constexpr", *cuda_gencode(arch)],
        extra_include_paths=[str(directory)], build_directory=str(directory))


def _load_extension(failure: str, **kwargs) -> Path:
    """torch.utils.cpp_extension.load with our ninja on PATH for the call alone; a failed build
    becomes a KernelBuildError that starts with `failure` and carries the compiler output."""
    from torch.utils import cpp_extension

    saved = os.environ.get("PATH")
    os.environ["PATH"] = _with_ninja_on_path()["PATH"]
    try:
        path = cpp_extension.load(is_python_module=False, verbose=False, **kwargs)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        raise KernelBuildError(f"{failure}:\n{e}") from e
    finally:
        if saved is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = saved
    return Path(path)


def load_library(path: Path) -> None:
    """Load a built CPU module (registers its ops under torch.ops.<namespace>)."""
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as e:
        raise KernelBuildError(f"loading {path} failed: {e}; delete its cache directory to rebuild") from e


def _run(cmd: list[str], what: str, timeout: int = 900) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise KernelBuildError(f"{what}: compiler not found ({cmd[0]}); install it or put it on PATH") from e
    except subprocess.TimeoutExpired as e:
        raise KernelBuildError(f"{what}: compiler timed out after {timeout}s: {' '.join(cmd)}") from e
    if proc.returncode != 0:
        raise KernelBuildError(f"{what} failed (exit {proc.returncode}):\n$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def nvcc() -> str | None:
    """Path of nvcc ($CUDA_HOME/bin, then PATH), or None."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def nvcc_supported_archs() -> tuple[str, ...]:
    """Real architectures this nvcc can target, as 'sm_XX' (from --list-gpu-arch)."""
    exe = nvcc()
    if exe is None:
        return ()
    out = subprocess.run([exe, "--list-gpu-arch"], capture_output=True, text=True).stdout.split()
    return tuple(a.replace("compute_", "sm_") for a in out if a.startswith("compute_"))


CUDA_MODES = {"cubin": ["-cubin"], "object": ["-c"], "shared": ["-shared"]}


def compile_cuda(source: Path, out: Path, arch: str, mode: str = "object") -> Path:
    """nvcc for one architecture: 'cubin' (device code only: the quickest full check of the kernels),
    'object' (device and host code), or 'shared' (a library for the ctypes harness)."""
    exe = nvcc()
    if exe is None:
        raise KernelBuildError("nvcc not found; set CUDA_HOME or put nvcc on PATH")
    if mode not in CUDA_MODES:
        raise KernelBuildError(f"mode: {mode!r} is not an nvcc mode; use one of {', '.join(CUDA_MODES)}")
    _run([exe, *nvcc_flags(arch), *CUDA_MODES[mode], "-I", str(source.parent), str(source), "-o", str(out)],
         f"nvcc {arch} {source.name}")
    return out


def syntax_check_binding(source: Path) -> None:
    """Compile-check the torch binding against this torch's headers (no CUDA needed: streams are ints)."""
    from torch.utils import cpp_extension

    incs = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    _run([cxx(), "-std=c++20", "-fsyntax-only", *[f"-I{i}" for i in incs], str(source)],
         f"binding check {source.name}")
