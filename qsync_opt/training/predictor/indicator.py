"""The weight indicator: quantisation noise of each operator's own weights, depth-loaded.

No data needed, so it is the default first indicator. For one op with weight W at precision p:

  integer p (symmetric per-tensor, scale s = max|W| / qmax, qmax = 2^(bits−1) − 1):
      F = s²/12 · numel(W)                 (variance of uniform rounding error, summed)
  floating p with m explicit mantissa bits:
      F = 2^(−2(m+1)) / 3 · Σ W²           (relative rounding error of round-to-nearest)
  fp32: 0.

B ≈ F (weights only: the backward error is not observed), so ω = (γ·(L − d) + d)·F
(sensitivity.py). For float formats the model ignores underflow of tiny values, so integer
and fp8 formats are not ordered by this indicator: for well-behaved (Gaussian) weights int8
is *less* noisy than fp8_e4m3 (7 bits of range resolution against 3 mantissa bits); a tensor
with outliers reverses that. What always holds: int4 ≥ int8 ≥ fp16, fp8_e5m2 ≥ fp8_e4m3 ≥
bf16 ≥ fp16 = tf32 ≥ fp32 = 0.

Ops without a weight (matmul/bmm between activations) have nothing to measure here: they get
the noise of a surrogate unit-RMS Gaussian operand the size of their second input (noted in
the result). The GVAR indicator (gvar.py) measures their real operands.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn

from qsync_opt.errors import ModelError
from qsync_opt.models.graph import OpGraph, OpNode
from qsync_opt.precision import INTEGER, MANTISSA_BITS
from qsync_opt.training.predictor.gvar import gvar_indicator, qmax
from qsync_opt.training.predictor.sensitivity import Sensitivity, check_precisions, depth_loading, normalise

__all__ = ["Sensitivity", "weight_indicator", "weight_noise", "gvar_indicator"]


def weight_stats(w: torch.Tensor) -> tuple[int, float, float]:
    """(numel, max |w|, Σw²): all the weight noise of every precision depends on, read once."""
    if w.numel() == 0:
        return 0, 0.0, 0.0
    w = w.detach().float()
    lo, hi = torch.aminmax(w)  # max |w| in one pass without an |w| copy (faster than abs().max(), same value)
    return w.numel(), max(-float(lo), float(hi)), _sum_of_squares(w.reshape(-1))


_SUMSQ_CHUNK = 1 << 14


def _sum_of_squares(flat: torch.Tensor) -> float:
    """Σx² without an x*x copy (whose allocation faults in every page of a tensor's size again):
    float32 dot products over chunks of 2^14, summed in double, within 1e-6 of the exact sum
    (tests/training/predictor/test_indicator_stats.py); one dot over a whole embedding is not, its float32
    accumulators drift. How far a dot drifts depends on the CPU's BLAS kernel: chunks of 2^18 met
    the test's 1e-6 on an AMX machine and missed it on an AVX-512 one without AMX."""
    return sum(float(torch.dot(c, c)) for c in flat.split(_SUMSQ_CHUNK))


def noise_from_stats(stats: tuple[int, float, float], precision: str) -> float:
    numel, amax, sumsq = stats
    if precision == "fp32" or numel == 0:
        return 0.0
    if precision in INTEGER:
        s = amax / qmax(precision)
        return s * s / 12.0 * numel
    return 2.0 ** (-2 * (MANTISSA_BITS[precision] + 1)) / 3.0 * sumsq


def weight_noise(w: torch.Tensor, precision: str) -> float:
    """Summed quantisation-noise variance of tensor `w` stored at `precision`."""
    return noise_from_stats(weight_stats(w), precision)


def surrogate_noise(numel: int, precision: str) -> float:
    """weight_noise of a unit-RMS Gaussian tensor: E max|x| ≈ sqrt(2 ln n), Σx² = n."""
    if precision == "fp32" or numel <= 0:
        return 0.0
    if precision in INTEGER:
        s = math.sqrt(2 * math.log(max(numel, 2))) / qmax(precision)
        return s * s / 12.0 * numel
    return 2.0 ** (-2 * (MANTISSA_BITS[precision] + 1)) / 3.0 * numel


def weight_of(module: nn.Module, node: OpNode) -> torch.Tensor | None:
    """The weight tensor `node` multiplies by (its module's, or a functional op's named one); None if it has none."""
    if getattr(node, "weight_fqn", None):  # a functional op's weight (F.linear(x, self.weight), x @ self.w)
        try:
            return module.get_parameter(node.weight_fqn)
        except AttributeError:
            return None
    try:
        sub = module.get_submodule(node.name)
    except AttributeError:
        return None
    w = getattr(sub, "weight", None)
    return w if isinstance(w, torch.Tensor) else None


def weight_indicator(module: nn.Module, graph: OpGraph, precisions: Iterable[str], *,
                     stats: "Callable[[OpNode], tuple[int, float, float]] | None" = None) -> Sensitivity:
    """ω[op][p] from the model's own weights, depth-loaded and normalised (sensitivity.py).

    `stats(node)`: the node's weight_stats computed elsewhere (weight_stream.py: a meta-device
    module whose weights are replayed one at a time); the module's weights are then not read."""
    ps = check_precisions(precisions)
    if not graph.selectable:
        raise ModelError(f"graph of {graph.model!r} has no selectable ops (conv, linear, matmul, embedding)")
    loading = depth_loading(graph)
    raw: dict[str, dict[str, float]] = {}
    surrogates = []
    for node in graph.selectable:
        w = weight_of(module, node)
        if w is not None and w.device.type == "meta" and stats is None:
            raise ModelError(
                f"{node.name}: weights are on the meta device; build the model on a real device "
                "to compute the weight indicator"
            )
        if w is None:
            if node.param_count:
                raise ModelError(
                    f"{node.name}: the graph says it has {node.param_count} parameters but the module "
                    "has no such submodule with a .weight; pass the module the graph was traced from"
                )
            numel = math.prod(node.input_shapes[-1]) if node.input_shapes else node.output_numel
            surrogates.append(node.name)
        fw, bw = loading[node.name]
        st = (stats(node) if stats is not None else weight_stats(w)) if w is not None else None
        raw[node.name] = {
            p: (fw + bw) * (noise_from_stats(st, p) if st is not None else surrogate_noise(numel, p)) for p in ps
        }
    omega, scale, ref = normalise(raw, ps)
    notes = ["B ≈ F (weights only); ω = (γ(L−d) + d)·F, γ = 4"]
    if surrogates:
        notes.append(f"no weight, unit-Gaussian surrogate operand: {', '.join(surrogates)}")
    return Sensitivity(omega, "weight", tuple(notes), scale, ref)
