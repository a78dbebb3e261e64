"""Pure-PyTorch implementations of every kernel op: the impl='torch' path and the reference.

Each function fixes the arithmetic order the templated kernels must reproduce bit for bit:
quantize is clamp(round_half_even(x.float() / scale)); the epilogue is
(float(acc) * (sx * sw)) + bias in fp32, then one rounding to the output dtype.
"""

from __future__ import annotations

import functools
import math

import torch

from qsync_opt.kernels.dtypes import FP8


def qmax_of(bits: int) -> int:
    return 2 ** (bits - 1) - 1


def channel_shape(x: torch.Tensor, axis: int | None) -> list[int]:
    """Shape that broadcasts a per-channel vector along `axis` of x (all ones for per tensor)."""
    shape = [1] * x.dim()
    if axis is not None:
        shape[axis] = x.shape[axis]
    return shape


def absmax(x: torch.Tensor, axis: int | None) -> torch.Tensor:
    """max |x| in fp32: a scalar tensor, or one value per slice along `axis`."""
    if x.numel() == 0:
        return torch.zeros(() if axis is None else (x.shape[axis],), dtype=torch.float32, device=x.device)
    if axis is None:  # the inf-norm is max|x| exactly, without an |x| temporary
        return torch.linalg.vector_norm(x, ord=float("inf")).float()
    dims = [d for d in range(x.dim()) if d != axis]
    return (torch.linalg.vector_norm(x, ord=float("inf"), dim=dims) if dims else x.abs()).float()


def scale_from_amax(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """amax / qmax correctly rounded in fp32 (as the kernels divide), 1 where amax is 0."""
    s = amax / torch.full_like(amax, qmax)  # a tensor divisor: CUDA torch multiplies by a Python scalar's reciprocal
    return torch.where(s == 0, torch.ones_like(s), s)


def quantize(x: torch.Tensor, *, bits: int, axis: int | None, scale: torch.Tensor | None, stochastic: bool,
             generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    qmax = qmax_of(bits)
    if scale is None:
        scale = scale_from_amax(absmax(x, axis), qmax)
    v = x.float() / scale.reshape(channel_shape(x, axis))
    if stochastic:
        v.add_(torch.rand(x.shape, generator=generator, dtype=torch.float32, device=x.device)).floor_()
    else:
        v.round_()  # round half to even
    return v.clamp_(-qmax, qmax).to(torch.int8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, *, axis: int | None, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale.float().reshape(channel_shape(q, axis))).to(dtype)


def _pad_to(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, cols - t.shape[1], 0, rows - t.shape[0]))


#: Every integer up to this magnitude is an fp32 value, so fp32 sums of integer products below it are exact.
FP32_EXACT = 1 << 24
#: int8 x int8 products per fp32 GEMM call that cannot pass FP32_EXACT (128² each).
FP32_EXACT_K = FP32_EXACT // (128 * 128)


def fp32_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(M, K) int8 @ (N, K)^T int8 -> (M, N) int32, exact, through fp32 GEMMs on the codes' values: K is split into
    calls of at most FP32_EXACT_K, whose every partial sum is an integer below 2**24 (exact in fp32 whatever the
    order or blocking), and their results are summed in int32."""
    acc = None
    for k0 in range(0, max(a.shape[1], 1), FP32_EXACT_K):
        part = (a[:, k0:k0 + FP32_EXACT_K].float() @ b[:, k0:k0 + FP32_EXACT_K].float().t()).to(torch.int32)
        acc = part if acc is None else acc.add_(part)
    return acc


@functools.lru_cache(maxsize=1)
def cpu_int_mm_exact() -> bool:
    """Whether torch._int_mm (oneDNN's s8 x s8 GEMM) is exact on this CPU in this process: it is with VNNI; without
    it (AVX2, or oneDNN capped by ONEDNN_MAX_CPU_ISA) pairs of u8 x s8 products saturate at int16. Probed once on
    all-extreme codes (where any pair saturates, these do) and on random ones, against float64."""
    g = torch.Generator().manual_seed(0)
    cases = [(torch.full((8, 256), 127, dtype=torch.int8), torch.full((8, 256), 127, dtype=torch.int8)),
             (torch.full((8, 256), 127, dtype=torch.int8), torch.full((8, 256), -127, dtype=torch.int8)),
             (torch.randint(-128, 128, (16, 256), dtype=torch.int8, generator=g),
              torch.randint(-128, 128, (16, 256), dtype=torch.int8, generator=g))]
    try:
        return all(torch.equal(torch._int_mm(a, b.t()).double(), a.double() @ b.double().t()) for a, b in cases)
    except (RuntimeError, AttributeError):
        return False


def int_mm_exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(M, K) int8 @ (N, K)^T int8 -> (M, N) int32, exact.

    torch._int_mm on CPU accepts any shape here (oneDNN), and is used where it is exact (cpu_int_mm_exact), else
    fp32_int_mm. CUDA's needs M > 16 and K, N multiples of 8: the operands are zero-padded (exact) and the result
    sliced. If _int_mm is missing or refuses, a float64 matmul is used: every product and partial sum is an integer
    below 2**53, so it is exact.
    """
    m, k = a.shape
    n = b.shape[0]
    if a.is_cuda:
        mp, kp, np_ = max(m, 17), -(-k // 8) * 8, -(-n // 8) * 8
        if (mp, kp, np_) != (m, k, n):
            return torch._int_mm(_pad_to(a, mp, kp), _pad_to(b, np_, kp).t())[:m, :n]
    elif not cpu_int_mm_exact():
        return fp32_int_mm(a, b)
    try:
        return torch._int_mm(a, b.t())
    except (RuntimeError, AttributeError):
        return (a.double() @ b.double().t()).to(torch.int32)


def epilogue(acc: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor | None,
             out_dtype: torch.dtype) -> torch.Tensor:
    s = sx.float().reshape(()) * sw.float().reshape(-1)
    y = acc * s  # an int32 acc is promoted to fp32 inside the multiply: float(acc) * s in one pass
    if bias is not None:
        y.add_(bias.float())
    return y.to(out_dtype)


def int8_linear(xq, sx, wq, sw, bias, out_dtype) -> torch.Tensor:
    return epilogue(int_mm_exact(xq, wq), sx, sw, bias, out_dtype)


FP8_LIBRARY_ACCUMULATOR_BITS = 14
"""Significand bits the fp8 tensor cores of sm_89/sm_90 keep while accumulating inside an MMA before a
library GEMM (cuBLASLt through torch._scaled_mm) promotes the partial sums to fp32 (about 14 bits,
DeepSeek-V3 section 3.3.2)."""


def fp8_gemm_tolerance(k: int, impl: str) -> float:
    """Norm-wise relative error an fp8 GEMM of inner size `k` may show against the exact product of the same
    fp8 values (the inputs are exact: only accumulation rounds).

    The templated kernels accumulate in fp32 registers: 1e-5. A library GEMM ('auto' or 'torch' where it
    runs torch._scaled_mm) accumulates in the tensor cores' narrower format: sqrt(k) * 2^-14, the
    probabilistic bound of a recursive sum of k terms at that unit roundoff (Higham & Mary, 2019).
    A wrong scale, operand or layout errs by O(1), far above either."""
    if impl == "templated":
        return 1e-5
    return max(1e-5, math.sqrt(k) * 2.0 ** -FP8_LIBRARY_ACCUMULATOR_BITS)


def fp8_roundtrip(x: torch.Tensor, fmt: str, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale into range, saturate to the format's largest finite value, cast, cast back, unscale."""
    info = FP8[fmt]
    xf = x.float()
    if scale is None:
        scale = scale_from_amax(absmax(xf, None), info["max"])
    s = scale.float()
    y = (xf / s).clamp_(-info["max"], info["max"]).to(info["torch"]).float() * s
    return y, s
