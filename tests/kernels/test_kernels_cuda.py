"""CUDA kernels: render per arch from tiles.yaml, compile with nvcc, and (with a GPU) check numbers.

Compile checks need only nvcc (skipped without it); numerical checks need a CUDA device and run
through the ctypes harness.
"""

from __future__ import annotations

import pytest
import torch

from qsync_opt.errors import KernelBuildError, SpecError
from qsync_opt.kernels import build, ops, reference
from qsync_opt.kernels.registry import compile_cuda
from qsync_opt.kernels.render import render_cuda
from qsync_opt.kernels.spec import CudaSpec, cuda_archs, tile_table

CHECK_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90"]
needs_nvcc = pytest.mark.skipif(build.nvcc() is None, reason="nvcc not found")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
cuda = pytest.mark.cuda  # selected by `pytest -m cuda` (benchmarks/gpu_check.py)


@pytest.mark.parametrize("arch", cuda_archs())
def test_renders_tiles_from_the_table(arch):
    spec = CudaSpec(arch=arch)
    r = render_cuda(spec)
    cu, binding = r.files[r.main], r.files[r.binding]
    assert "#include <torch" not in cu and "ATen" not in cu  # the .cu is self-contained
    assert "#include <torch/library.h>" in binding
    for kind, t in tile_table()["archs"][arch].items():
        alias = {"int8": "Int8Tile", "int4": "Int4Tile", "fp8": "Fp8Tile"}[kind]
        dims = ", ".join(str(t[k]) for k in ("block_m", "block_n", "block_k", "warps_m", "warps_n"))
        assert f"using {alias} = qsync::cuda::Tile<{dims}>;" in cu
        assert f"qsync_{kind}_gemm" in cu and f"{kind}_gemm(" in binding
        assert f"{kind}_{t['block_m']}x{t['block_n']}x{t['block_k']}" in r.name
    assert ("qsync_int4_gemm" in cu) == (arch != "sm_90")  # no sub-byte WMMA on Hopper
    assert ("qsync_fp8_gemm" in cu) == (int(arch[3:]) >= 89)


def test_parameters_reach_the_source():
    r = render_cuda(CudaSpec(arch="sm_90", in_dtype="fp16", out_dtype="bf16", granularity="tensor", fp8_format="e5m2"))
    cu = r.files[r.main]
    assert "using In = __half;" in cu and "using Out = __nv_bfloat16;" in cu
    assert "kPerChannel = false" in cu and "Fp8::e5m2" in cu and "kFp8Max = 57344.0f" in cu
    assert r.name == "qsync_sm90_in_fp16_out_bf16_tensor_int8_128x128x64_fp8_128x128x64_e5m2"


def test_spec_errors_name_the_field():
    with pytest.raises(SpecError, match="CudaSpec.arch: 'sm_61' has no entry in tiles.yaml; known: sm_75"):
        CudaSpec(arch="sm_61")
    with pytest.raises(SpecError, match="CudaSpec.out_dtype"):
        CudaSpec(out_dtype="fp16")
    with pytest.raises(SpecError, match="CudaSpec.granularity"):
        CudaSpec(granularity="group")


def _nvcc_can(arch):
    if arch not in build.nvcc_supported_archs():
        pytest.skip(f"this nvcc cannot target {arch} (its --list-gpu-arch: {build.nvcc_supported_archs()})")


@needs_nvcc
@pytest.mark.parametrize("arch", CHECK_ARCHS)
def test_kernels_compile_with_nvcc(arch):
    _nvcc_can(arch)
    # device code for every arch; host launchers and the torch binding once, on sm_89 (every GEMM kind)
    full = arch == "sm_89"
    art = compile_cuda(CudaSpec(arch=arch), mode="object" if full else "cubin", check_binding=full)
    assert art.output.exists() and art.output.stat().st_size > 0


@needs_nvcc
def test_other_parameter_sets_compile():
    _nvcc_can("sm_90")
    spec = CudaSpec(arch="sm_90", in_dtype="fp32", out_dtype="bf16", granularity="tensor", fp8_format="e5m2")
    assert compile_cuda(spec, mode="cubin", check_binding=False).output.exists()


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_every_arch_compiles_host_code_and_binding(arch):
    _nvcc_can(arch)
    assert compile_cuda(CudaSpec(arch=arch), mode="object", check_binding=True).binding.exists()


@needs_nvcc
def test_nvcc_failure_raises_with_its_output(tmp_path):
    src = tmp_path / "broken.cu"
    src.write_text("__global__ void k() { undeclared_qsync_cuda_symbol = 1; }\n")
    with pytest.raises(KernelBuildError, match="undeclared_qsync_cuda_symbol"):
        build.compile_cuda(src, tmp_path / "broken.o", "sm_80")


# ---- numerical checks on a GPU (not run on the CPU-only development machine) -----------------------

@pytest.fixture(scope="module")
def kernels():
    from qsync_opt.kernels.cuda_harness import CudaKernels, arch_for_device

    return CudaKernels(CudaSpec(arch=arch_for_device(), in_dtype="fp32", out_dtype="fp32"))


@cuda
@needs_gpu
@needs_nvcc
@pytest.mark.parametrize("axis", [None, 0])
def test_gpu_quantize_matches_reference(kernels, axis):
    x = torch.randn(300, 517, device="cuda") * 3
    q, s = kernels.quantize(x, axis=axis)
    qr, sr = reference.quantize(x, bits=8, axis=axis, scale=None, stochastic=False, generator=None)
    assert torch.equal(s, sr) and torch.equal(q, qr)
    y = kernels.dequantize(q, s, axis=axis)
    assert torch.equal(y, reference.dequantize(q, s, axis=axis, dtype=torch.float32))


@cuda
@needs_gpu
@needs_nvcc
def test_gpu_stochastic_rounding_matches_the_cpu_kernels(kernels):
    x = torch.randn(1000, 37)
    q_cpu, s = ops.quantize_symmetric(x, stochastic=True, generator=torch.Generator().manual_seed(3), impl="templated")
    from qsync_opt.kernels.registry import get_cpu_module

    seed = int(torch.randint(0, 2**62, (), generator=torch.Generator().manual_seed(3)))
    q_cpu2, _ = get_cpu_module().ops.quantize(x, s, 127, None, True, seed)
    q_gpu, _ = kernels.quantize(x.cuda(), scale=s.cuda(), stochastic=True, seed=seed)
    assert torch.equal(q_cpu, q_cpu2) and torch.equal(q_gpu.cpu(), q_cpu2)


@cuda
@needs_gpu
@needs_nvcc
@pytest.mark.parametrize("m,k,n", [(1, 16, 8), (17, 64, 5), (130, 515, 257), (512, 1024, 768)])
def test_gpu_int8_gemm_is_bit_exact(kernels, m, k, n):
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    wq = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
    sx, sw, b = torch.tensor(0.02, device="cuda"), torch.rand(n, device="cuda") + 0.01, torch.randn(n, device="cuda")
    y = kernels.int8_linear(xq, sx, wq, sw, b)
    assert torch.equal(y, reference.int8_linear(xq, sx, wq, sw, b, torch.float32))


@cuda
@needs_gpu
@needs_nvcc
@pytest.mark.parametrize("m,k,n", [(8, 32, 8), (33, 101, 40), (256, 512, 384)])
def test_gpu_int4_gemm_is_bit_exact(kernels, m, k, n):
    if kernels.spec.tile("int4") is None:
        pytest.skip(f"no int4 GEMM on {kernels.spec.arch}")
    xq = torch.randint(-7, 8, (m, k), dtype=torch.int8, device="cuda")
    wq = torch.randint(-7, 8, (n, k), dtype=torch.int8, device="cuda")
    sx, sw = torch.tensor(0.1, device="cuda"), torch.rand(n, device="cuda") + 0.01
    y = kernels.int4_linear(xq, sx, wq, sw)
    assert torch.equal(y, reference.int8_linear(xq, sx, wq, sw, None, torch.float32))


@cuda
@needs_gpu
@needs_nvcc
@pytest.mark.parametrize("m,k,n", [(16, 32, 8), (70, 200, 90), (256, 1024, 512)])
def test_gpu_fp8_gemm_matches_fp32_on_the_fp8_values(kernels, m, k, n):
    if kernels.spec.tile("fp8") is None:
        pytest.skip(f"no fp8 GEMM on {kernels.spec.arch}")
    x, w = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda")
    xq, sx = kernels.quantize_fp8(x)
    wq, sw = kernels.quantize_fp8(w)
    xr, sxr = ops.fp8_roundtrip(x, kernels.spec.fp8_format)
    assert torch.equal(sx, sxr) and torch.equal(xq.float() * sx, xr)  # same cast as torch's
    y = kernels.fp8_linear(xq, sx, wq, sw)
    ref = (xq.float() @ wq.float().T) * (sx * sw)
    assert torch.allclose(y, ref, rtol=1e-5, atol=1e-4 * float(ref.abs().max()))
