"""Code generation: a spec in, source text out. No compiler, no file system writes.

Templates hold types and constants; the headers they include hold the logic. A rendering
bundles the generated file with copies of the headers it includes, so that the cache key
(a hash of every file) changes whenever any of them does.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import jinja2

from qsync_opt.kernels.dtypes import CPU_CTYPE, CUDA_CTYPE, FP8
from qsync_opt.kernels.spec import CpuSpec, CudaSpec, tile_table

HERE = Path(__file__).parent
INCLUDE_DIR = HERE / "include"

CPU_HEADERS = ("qsync_cpu_kernels.h", "qsync_cpu_ops.h")
CUDA_HEADERS = ("qsync_cuda_common.cuh", "qsync_cuda_quant.cuh", "qsync_cuda_gemm_wmma.cuh", "qsync_cuda_gemm_fp8.cuh",
                "qsync_cuda_launch.cuh")


@dataclass(frozen=True)
class Rendered:
    """Files of one module: name -> text. `main` (and `binding`, for CUDA) name the compiled ones."""

    name: str
    files: dict
    main: str
    namespace: str
    binding: str | None = None

    def digest(self) -> str:
        h = hashlib.sha256()
        for fname in sorted(self.files):
            h.update(fname.encode() + b"\0" + self.files[fname].encode() + b"\0")
        return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def _headers(names) -> dict:
    return {n: (INCLUDE_DIR / n).read_text() for n in names}


def op_namespace(digest: str) -> str:
    """torch.ops namespace of a module: unique per content, a valid identifier. A process can load
    one library per namespace, so the salt (the cache root) keeps two caches' builds apart."""
    return f"qsync_{digest[:16]}"


def render_cpu(spec: CpuSpec, salt: str = "") -> Rendered:
    """The CPU extension's translation unit plus its headers; `salt` goes into the op namespace only."""
    headers = _headers(CPU_HEADERS)
    # The namespace must be known inside the source, so it is derived from everything *but* itself.
    pre = hashlib.sha256(repr(spec).encode() + "".join(headers.values()).encode() + salt.encode()).hexdigest()
    ns = op_namespace(pre)
    text = _env().get_template("cpu_ops.cpp.j2").render(
        spec=spec, spec_repr=repr(spec), namespace=ns,
        in_ctypes=[CPU_CTYPE[d] for d in spec.in_dtypes], out_ctypes=[CPU_CTYPE[d] for d in spec.out_dtypes])
    main = f"{spec.name}.cpp"
    return Rendered(name=spec.name, files={main: text, **headers}, main=main, namespace=ns)


def render_cuda(spec: CudaSpec) -> Rendered:
    """A self-contained .cu (no torch headers) with extern "C" launchers, and a torch binding .cpp."""
    headers = _headers(CUDA_HEADERS)
    q = tile_table()["quantize"]
    ctx = dict(spec=spec, spec_repr=repr(spec), in_ctype=CUDA_CTYPE[spec.in_dtype], out_ctype=CUDA_CTYPE[spec.out_dtype],
               per_channel="true" if spec.granularity == "channel" else "false", quant=q,
               int8=spec.tile("int8"), int4=spec.tile("int4"), fp8=spec.tile("fp8"),
               fp8_ctype=FP8[spec.fp8_format]["cuda"], fp8_ptx=FP8[spec.fp8_format]["ptx"],
               fp8_max=FP8[spec.fp8_format]["max"])
    pre = hashlib.sha256(repr(spec).encode() + "".join(headers.values()).encode()).hexdigest()
    ctx["namespace"] = op_namespace(pre)
    kernels = _env().get_template("cuda_kernels.cu.j2").render(**ctx)
    binding = _env().get_template("cuda_binding.cpp.j2").render(**ctx)
    main, bind = f"{spec.name}.cu", f"{spec.name}_binding.cpp"
    return Rendered(name=spec.name, files={main: kernels, bind: binding, **headers}, main=main,
                    namespace=ctx["namespace"], binding=bind)
