"""Worst-case error bounds for quantized GEMMs, derived from the number formats (float64 maths).

Why these bounds: for y = Σ_k a_k b_k computed from perturbed inputs ã = a + α, b̃ = b + β
(|α| ≤ eA, |β| ≤ eB elementwise), accumulated in fp32 (error ≤ γ_K Σ|ã b̃|, γ_K ≈ K·2^-24)
and rounded once to the output format (relative unit roundoff u_out),
    |ŷ - y| ≤ f(eA,|b|) + f(|a|,eB) + f(eA,eB) + (u_out + γ_K) · f(|a|+eA, |b|+eB)
where f is the bilinear map itself (linear, conv, matmul) applied to non-negative tensors,
which turns every Σ a_k b_k into Σ |a_k||b_k|. The input errors come from the formats:
  bf16: |x|·2^-8        fp16: |x|·2^-11 + 2^-25 (subnormals)
  fp8 e4m3 / e5m2 with scale s = amax/fmax: |x|·2^-4 + 2^-10·s  /  |x|·2^-3 + 2^-17·s
  int8 / int4 with scale s = amax/qmax: s·(1/2 + 2^-16) nearest (the 2^-16 covers fp32 rounding
  of x/s), s·(1 + 2^-16) stochastic.
The bound is elementwise and rigorous up to second-order terms, for which SLACK leaves 2 %.
"""

from __future__ import annotations

import torch

U = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 0.0, "tf32": 0.0}
FP8 = {"fp8_e4m3": (448.0, 2.0**-4, 2.0**-10), "fp8_e5m2": (57344.0, 2.0**-3, 2.0**-17)}
QMAX = {"int8": 127, "int4": 7}
SLACK = 1.02
EPS32 = 2.0**-24


def gamma(k: int) -> float:
    return 1.01 * k * EPS32


def format_error(t: torch.Tensor, precision: str, *, rows: bool = False, stochastic: bool = False) -> torch.Tensor:
    """Elementwise bound on |round(t) - t| for `precision`; `rows`: per-row (axis 0) integer scales."""
    t = t.double()
    a = t.abs()
    if precision in ("fp32", "tf32"):
        return torch.zeros_like(a)
    if precision == "bf16":
        return a * U["bf16"]
    if precision == "fp16":
        return a * U["fp16"] + 2.0**-25
    if precision in FP8:
        fmax, u, sub = FP8[precision]
        s = a.max() / fmax
        return a * (u + 2 * EPS32) + sub * s
    qmax = QMAX[precision]
    amax = a.reshape(a.shape[0], -1).amax(1).reshape(-1, *[1] * (a.dim() - 1)) if rows else a.max()
    s = amax / qmax
    return (1.0 if stochastic else 0.5) * s * (1 + 2.0**-16) + torch.zeros_like(a)


def bilinear_bound(f, a, ea, b, eb, u_out: float, k: int, abs_out: float = 0.0) -> torch.Tensor:
    """Elementwise bound on |f̂(ã, b̃) - f(a, b)| (see module docstring)."""
    a, b = a.double().abs(), b.double().abs()
    ea, eb = ea.double(), eb.double()
    return SLACK * (f(ea, b) + f(a, eb) + f(ea, eb) + (u_out + gamma(k)) * f(a + ea, b + eb)) + abs_out


def then_round(e: torch.Tensor, t: torch.Tensor, bd: str) -> torch.Tensor:
    """Error of a dequantised value after it is also rounded to the backward dtype `bd`."""
    extra = 2.0**-25 if bd == "fp16" else 0.0
    return e + U[bd] * (t.double().abs() + e) + extra


def out_unit(precision: str) -> float:
    """Relative rounding of the forward output: float formats round to themselves; fp8 GEMMs run in
    fp32; the int8 epilogue rounds acc*(sx*sw)+bias three times in fp32."""
    if precision in U:
        return U[precision]
    if precision in FP8:
        return 0.0
    return 3 * EPS32
