"""Precision boundaries as named steps, so a profiler can time every cast and quantization.

Each helper runs inside `torch.profiler.record_function("qsync::...")` when a profiler is
active (and costs nothing extra otherwise). The predictor's cast cost model is checked
against exactly these ranges.
"""

from __future__ import annotations

import contextlib

import torch

from qsync_opt.kernels import ops as kops
from qsync_opt.runtime.recipe import INT_BITS, Recipe

_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def scope(name: str):
    """A profiler range named `qsync::<name>` while profiling; a no-op context otherwise."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(f"qsync::{name}")
    return contextlib.nullcontext()


def cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """`t.to(dtype)` as a visible `qsync::cast[a->b]` step; free when the dtype already matches."""
    if t is None or t.dtype == dtype:
        return t
    with scope(f"cast[{_SHORT.get(t.dtype, t.dtype)}->{_SHORT.get(dtype, dtype)}]"):
        return t.to(dtype)


class Quantized:
    """Codes and scale of one quantized tensor: what an fp8/int operator keeps for backward.

    Integer codes are int8 (int4 values live in int8, clamped to ±7); fp8 codes are stored
    in torch's float8 dtypes. `axis` is the per-channel axis of `scale`, or None.
    """

    __slots__ = ("codes", "scale", "axis", "fp8", "impl")

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, axis: int | None, fp8: bool, impl: str = "auto"):
        self.codes, self.scale, self.axis, self.fp8, self.impl = codes, scale, axis, fp8, impl

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        with scope(f"dequantize[{'fp8' if self.fp8 else 'int'}->{_SHORT.get(dtype, dtype)}]"):
            if self.fp8:
                out = self.codes.to(torch.float32) * self.scale
                return out if dtype == torch.float32 else out.to(dtype)
            return kops.dequantize(self.codes, self.scale, axis=self.axis, dtype=dtype, impl=self.impl)


def quantize(t: torch.Tensor, recipe: Recipe, *, per_channel: bool = False) -> Quantized:
    """Quantize `t` for `recipe` (fp8 or int). `per_channel` scales along axis 0 (int only).

    Integer formats: symmetric, scale = amax/qmax, nearest or stochastic rounding, through
    kernels.ops.quantize_symmetric. FP8: kernels.ops.quantize_fp8 (per-tensor scale amax/max,
    saturating, nearest): the codes are the values fp8_roundtrip multiplies back by the scale.
    """
    t = t.detach()
    if recipe.path == "fp8":
        fmt = recipe.precision.split("_")[1]
        with scope(f"quantize[{recipe.precision}]"):
            codes, scale = kops.quantize_fp8(t.float(), fmt, impl=recipe.kernels)
        return Quantized(codes, scale.float(), None, fp8=True, impl=recipe.kernels)
    axis = 0 if per_channel else None
    with scope(f"quantize[{recipe.precision}{'/ch' if per_channel else ''}]"):
        q, s = kops.quantize_symmetric(
            t.float(), bits=INT_BITS[recipe.precision], axis=axis, stochastic=recipe.stochastic, impl=recipe.kernels
        )
    return Quantized(q, s, axis, fp8=False, impl=recipe.kernels)


class StraightThrough(torch.autograd.Function):
    """Forward returns `approx` (a rounded copy of `exact`); backward passes the gradient to `exact`.

    Used by embeddings: the lookup reads quantized rows, the gradient scatters in fp32 onto
    the master table.
    """

    @staticmethod
    def forward(ctx, exact, approx):
        return approx

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@contextlib.contextmanager
def tf32_enabled(on: bool):
    """Scope TF32 tensor-core math (CUDA only) to one operator and restore the previous flags."""
    if not on:
        yield
        return
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
