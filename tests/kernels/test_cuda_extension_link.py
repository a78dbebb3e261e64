"""The CUDA torch extension, built for real without a GPU or a CUDA torch: the nvcc-compiled kernels
and the compiled torch binding link into one library (no undefined symbols) that this CPU torch
loads, registering every op with the schema cuda_ops.py calls. What cannot run here: the kernels."""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch

from qsync_opt.kernels import build
from qsync_opt.kernels.registry import compile_cuda
from qsync_opt.kernels.render import render_cuda
from qsync_opt.kernels.spec import CudaSpec


def _cuda_home() -> Path | None:
    exe = build.nvcc()
    if exe is None:
        return None
    for p in (Path(exe).resolve().parent.parent, Path("/usr/local/cuda")):
        if (p / "lib64" / "libcudart.so").exists():
            return p
    return None


@pytest.mark.slow
@pytest.mark.skipif(_cuda_home() is None or "sm_89" not in build.nvcc_supported_archs(),
                    reason="needs nvcc that targets sm_89 and libcudart")
def test_extension_links_loads_and_registers_every_op(tmp_path):
    from torch.utils import cpp_extension

    spec = CudaSpec(arch="sm_89")  # every GEMM kind; the object is cached by test_kernels_cuda
    art = compile_cuda(spec, mode="object", check_binding=True)
    incs = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    obj, lib = tmp_path / "binding.o", tmp_path / "ext.so"
    subprocess.run([build.cxx(), "-std=c++17", "-O0", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w",
                    *[f"-I{i}" for i in incs], "-c", str(art.binding), "-o", str(obj)], check=True)
    cuda, tlib = _cuda_home(), Path(torch.__file__).parent / "lib"
    r = subprocess.run([build.cxx(), "-shared", str(obj), str(art.output), "-o", str(lib), f"-L{tlib}", "-lc10",
                        "-ltorch_cpu", f"-L{cuda}/lib64", "-lcudart", f"-Wl,-rpath,{cuda}/lib64", "-Wl,--no-undefined"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    torch.ops.load_library(str(lib))
    ops = getattr(torch.ops, f"{render_cuda(spec).namespace}_cuda")
    schemas = {name: str(getattr(ops, name).default._schema).split("::", 1)[1] for name in
               ("quantize", "absmax", "dequantize", "int8_gemm", "pack_int4", "int4_gemm", "quantize_fp8", "fp8_gemm")}
    assert schemas["int4_gemm"] == ("int4_gemm(Tensor a, Tensor b, int k, Tensor sx, Tensor sw, Tensor? bias, "
                                    "int stream) -> Tensor")
    assert schemas["quantize"].startswith("quantize(Tensor x, Tensor? scale, int qmax, int? axis, bool stochastic")
    assert all(s.rstrip(")").split("->")[0].rstrip().endswith("int stream)") for s in schemas.values())
    # the binding's own checks run on CPU: a CPU tensor is refused before any kernel is launched
    with pytest.raises(RuntimeError, match="x: expected a contiguous CUDA"):
        ops.absmax(torch.ones(4, dtype=torch.bfloat16), None, 0)
