"""Hessian-trace indicator (HAWQ-v2 style): Tr(H_W)/n · ‖Q_p(W) − W‖² per op and precision.

Tr(H_W), the trace of the loss Hessian restricted to an op's weight, is estimated with
Hutchinson's method: E_v[vᵀ H v] over Rademacher probes v, each product H·v by double
backward (Yao et al., HAWQ-V2, NeurIPS 2020; PyHessian). The quantisation error ‖Q_p(W) − W‖²
is that of the actual rounding to p: symmetric per-tensor integers, bf16/fp16/tf32 mantissa
rounding, fp8 with a per-tensor scale. Ops without a weight (matmul between activations)
get the mean per-element trace times a unit-Gaussian surrogate's error (noted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from qsync_opt.errors import ModelError
from qsync_opt.models.graph import OpGraph
from qsync_opt.precision import INTEGER
from qsync_opt.predictor.gvar import qmax
from qsync_opt.predictor.sensitivity import Sensitivity, check_precisions, normalise

FP8 = {"fp8_e4m3": ("float8_e4m3fn", 448.0), "fp8_e5m2": ("float8_e5m2", 57344.0)}


def quantisation_error(w: torch.Tensor, p: str) -> float:
    """‖Q_p(W) − W‖² of rounding `w` to precision `p` (0 at fp32)."""
    w = w.detach().double()
    if p == "fp32":
        return 0.0
    if p in INTEGER:
        s = w.abs().max() / qmax(p)
        if s == 0:
            return 0.0
        q = torch.round(w / s).clamp(-qmax(p), qmax(p)) * s
    elif p in ("bf16", "fp16"):
        q = w.float().to(torch.bfloat16 if p == "bf16" else torch.float16).double()
    elif p == "tf32":  # 10 explicit mantissa bits: round the float32 to nearest
        bits = w.float().view(torch.int32)
        q = ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32).double()
    elif p in FP8:
        name, fmax = FP8[p]
        s = w.abs().max() / fmax
        if s == 0:
            return 0.0
        q = (w / s).float().to(getattr(torch, name)).double() * s
    else:
        raise ModelError(f"hessian indicator: no rounding model for precision {p!r}")
    return float(((q - w) ** 2).sum())


def hutchinson_traces(model: nn.Module, weights: dict[str, torch.Tensor], batches: Sequence,
                      loss_fn: Callable, *, probes: int = 8, seed: int = 0) -> dict[str, float]:
    """op -> Tr(∂²L/∂W²) estimated from `probes` Rademacher vectors per batch, averaged over batches.

    Each op is probed alone (v on its weight, zero elsewhere), as HAWQ does per block, so a
    sample is exactly v_iᵀ H_ii v_i: probing all weights at once would add cross terms
    v_iᵀ H_ij v_j, zero in expectation but large enough at a few probes to flip signs.
    """
    names = list(weights)
    params = [weights[n] for n in names]
    g = torch.Generator().manual_seed(seed)
    total = {n: 0.0 for n in names}
    count = 0
    for inputs, targets in batches:
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model(*inputs), targets)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        for _ in range(probes):
            for i, n in enumerate(names):
                v = (torch.randint(0, 2, params[i].shape, generator=g) * 2 - 1).to(params[i].dtype)
                (hv,) = torch.autograd.grad(grads[i], params[i], grad_outputs=v, retain_graph=True)
                total[n] += float((v * hv).sum())
            count += 1
    if count == 0:
        raise ModelError("hessian indicator: got no calibration batches")
    return {n: t / count for n, t in total.items()}


def hessian_indicator(module: nn.Module, graph: OpGraph, batches: Sequence, loss_fn: Callable,
                      precisions: Iterable[str], *, probes: int = 8, seed: int = 0) -> Sensitivity:
    """ω[op][p] = Tr(H_W)/n · ‖Q_p(W) − W‖², normalised like every indicator (sensitivity.py)."""
    ps = check_precisions(precisions)
    model = module
    weights, surrogate = {}, []
    for node in graph.selectable:
        try:
            w = getattr(model.get_submodule(node.name), "weight", None)
        except AttributeError:
            w = None
        if isinstance(w, torch.Tensor) and w.requires_grad:
            weights[node.name] = w
        else:
            surrogate.append(node.name)
    if not weights:
        raise ModelError(f"hessian indicator: no selectable op of {graph.model!r} has a trainable weight")
    traces = hutchinson_traces(model, weights, batches, loss_fn, probes=probes, seed=seed)
    per_elem = {n: max(traces[n], 0.0) / weights[n].numel() for n in weights}
    mean = sum(per_elem.values()) / len(per_elem)
    raw = {}
    for node in graph.selectable:
        if node.name in weights:
            w = weights[node.name]
            raw[node.name] = {p: per_elem[node.name] * quantisation_error(w, p) for p in ps}
        else:
            numel = 1
            for s in (node.input_shapes[-1] if node.input_shapes else node.output_shape):
                numel *= s
            z = torch.randn(numel, generator=torch.Generator().manual_seed(seed))
            raw[node.name] = {p: mean * quantisation_error(z, p) for p in ps}
    omega, scale, ref = normalise(raw, ps)
    notes = [f"Hutchinson trace, {probes} Rademacher probes per batch, {len(batches)} batches; "
             "negative trace estimates clamped at 0"]
    if surrogate:
        notes.append(f"no weight, mean trace × unit-Gaussian surrogate: {', '.join(surrogate)}")
    return Sensitivity(omega, "hessian", tuple(notes), scale, ref)
