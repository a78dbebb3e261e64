"""An int8 GEMM with the fused dequantising epilogue, written in Triton (optional: `pip install triton`).

Why a second kernel family: Triton's interpreter (TRITON_INTERPRET=1) executes a kernel on CPU
tensors, so CI runs its GPU-side logic (the K loop over tiles, masking of ragged edges, the
epilogue's scale and bias order) bit for bit, while the CUDA templates can only be compiled there.
It is not in kernels/dispatch.py's table: benchmarks/gpu_check.py times it beside the templated
WMMA kernel and torch._int_mm, and only a measured win would put it there.

Arithmetic (reference.int8_linear): acc = sum_k int32(a[m, k] * b[n, k]) exactly, then
y = (float(acc) * (sx * sw[n])) + bias[n] in fp32, each step rounded (fp fusion disabled, so
the compiler cannot contract the multiply and add into an FMA).
"""

from __future__ import annotations

import torch

from qsync_opt.errors import KernelBuildError
from qsync_opt.kernels.dispatch import Target

try:  # optional dependency: importing this module without triton gives a clear error on use
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = tl = None

#: Tiles (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) by where the kernel runs; tl.dot needs every block
#: dimension >= 16. The interpreter takes small tiles (it runs one program at a time on the CPU); a GPU takes the
#: large, multi-stage tiles of Triton's matmul tutorials, within the shared memory of its architecture: 16 KiB of
#: int8 A and B per stage at 128x128x64 (sm_80 on: 4 stages), 4 KiB at 64x64x32 (sm_75's 64 KiB: 2 stages).
INTERPRETER_TILES = (32, 32, 32, 4, 1)
CUDA_TILES = {80: (128, 128, 64, 8, 4), 75: (64, 64, 32, 4, 2)}


def tiles_for(device: torch.device) -> tuple[int, int, int, int, int]:
    """The tiles int8_linear launches with on `device` (module constants)."""
    target = Target.of_device(device)
    if target.kind != "cuda":
        return INTERPRETER_TILES
    return CUDA_TILES[80] if target.sm >= 80 else CUDA_TILES[75]


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _int8_gemm_kernel(a_ptr, b_ptr, c_ptr, sx_ptr, sw_ptr, bias_ptr, M, N, K,
                          stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
                          PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.int32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :] * stride_ak,
                        mask=(rm[:, None] < M) & (kk[None, :] < K), other=0)
            b = tl.load(b_ptr + rn[None, :] * stride_bn + kk[:, None] * stride_bk,
                        mask=(rn[None, :] < N) & (kk[:, None] < K), other=0)
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        sx = tl.load(sx_ptr)
        if PER_CHANNEL:
            sw = tl.load(sw_ptr + rn, mask=rn < N, other=1.0)
        else:
            sw = tl.load(sw_ptr + rn * 0)
        y = acc.to(tl.float32) * (sx * sw)[None, :]
        if HAS_BIAS:
            y = y + tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, y, mask=(rm[:, None] < M) & (rn[None, :] < N))


def int8_linear(xq: torch.Tensor, sx: torch.Tensor, wq: torch.Tensor, sw: torch.Tensor,
                bias: torch.Tensor | None = None, tiles: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """y = (xq @ wq.T) * sx * sw (+ bias) in fp32; xq (M, K) and wq (N, K) int8, sw scalar or (N,).
    Arguments are assumed checked (ops._check_linear does it for the ops API). `tiles`: tiles_for(device) unless
    given (the result does not depend on them: integer sums are exact, the epilogue is per element)."""
    if triton is None:
        raise KernelBuildError("the Triton GEMM needs triton: pip install triton (or qsync-opt[triton])")
    (m, k), n = xq.shape, wq.shape[0]
    dev = xq.device
    sx = sx.to(dev, torch.float32).reshape(1).contiguous()
    sw = sw.to(dev, torch.float32).reshape(-1).contiguous()
    b = bias.to(dev, torch.float32).contiguous() if bias is not None else sw  # unused when HAS_BIAS is False
    c = torch.empty(m, n, dtype=torch.float32, device=dev)
    bm, bn, bk, warps, stages = tiles or tiles_for(dev)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _int8_gemm_kernel[grid](xq, wq, c, sx, sw, b, m, n, k, xq.stride(0), xq.stride(1), wq.stride(0), wq.stride(1),
                            c.stride(0), c.stride(1), PER_CHANNEL=sw.numel() > 1, HAS_BIAS=bias is not None,
                            BM=bm, BN=bn, BK=bk, enable_fp_fusion=False, num_warps=warps, num_stages=stages)
    return c
