"""Empirical indicator: the measured loss change when only one op runs at a lower precision.

For each selectable op and precision p: swap that op alone for the runtime's quantized
module at p (runtime.apply_plan), run the fixed calibration batches forward in eval mode,
and take |L_p − L_fp32| averaged over the batches. It is the ground truth the cheaper
indicators are judged against (benchmarks/predictor.py), and costs ops × precisions forward
passes. Functional GEMMs (F.linear, torch.matmul, ...) are first rewritten into modules at
the planner's FQNs, as the trainer does (models.rewrite), so they are measured like any other
op; an op that still has no module (none today) would run fp32 and is noted with change 0.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from qsync_opt.models.graph import OpGraph
from qsync_opt.training.predictor.sensitivity import Sensitivity, check_precisions, normalise
from qsync_opt.models.rewrite import make_applicable
from qsync_opt.runtime.apply import apply_plan, selectable_modules


@torch.no_grad()
def _mean_loss(model: nn.Module, batches: Sequence, loss_fn: Callable) -> float:
    return sum(float(loss_fn(model(*inputs), targets)) for inputs, targets in batches) / len(batches)


def measurable(module: nn.Module, ops: Sequence[str], batches: Sequence, leaf_modules: Iterable = ()) -> nn.Module:
    """`module` with its functional GEMMs among `ops` rewritten into modules, as the trainer does
    (models.rewrite.applicable_model); `module` itself when every op already is one."""
    missing = set(ops) - {name for name, _ in module.named_modules()}
    if not missing or not batches:
        return module

    return make_applicable(module, tuple(batches[0][0]), leaf_modules=leaf_modules, fqns=missing)


def loss_changes(module: nn.Module, ops: Sequence[str], batches: Sequence, loss_fn: Callable,
                 precisions: Iterable[str], *, backward_precision: str = "bf16",
                 leaf_modules: Iterable = ()) -> tuple[dict, float]:
    """({op: {p: |ΔL|}}, fp32 loss) with one op at a time lowered to p."""

    model = measurable(copy.deepcopy(module), ops, batches, leaf_modules).eval()
    base = _mean_loss(model, batches, loss_fn)
    swappable = set(selectable_modules(model))
    out: dict[str, dict[str, float]] = {}
    for op in ops:
        out[op] = {}
        for p in precisions:
            if p == "fp32" or op not in swappable:
                out[op][p] = 0.0
                continue
            m = apply_plan(model, {op: p}, backward_precision=backward_precision)
            out[op][p] = abs(_mean_loss(m, batches, loss_fn) - base)
            model = apply_plan(m, {op: "fp32"})
    return out, base


def empirical_indicator(module: nn.Module, graph: OpGraph, batches: Sequence, loss_fn: Callable,
                        precisions: Iterable[str], *, backward_precision: str = "bf16",
                        leaf_modules: Iterable = ()) -> Sensitivity:
    """`leaf_modules`: those the graph was traced with (the spec's model.leaf_modules), so the
    rewrite of functional GEMMs names them as the planner does."""
    ps = check_precisions(precisions)
    ops = [n.name for n in graph.selectable]
    raw, base = loss_changes(module, ops, batches, loss_fn, ps, backward_precision=backward_precision,
                             leaf_modules=leaf_modules)

    swappable = selectable_modules(measurable(module, ops, batches, leaf_modules))
    fixed = [op for op in ops if op not in swappable]
    omega, scale, ref = normalise(raw, ps)
    notes = [f"|loss change| with one op lowered, mean over {len(batches)} calibration batches "
             f"(fp32 loss {base:.4f})"]
    if fixed:
        notes.append(f"not swappable by the runtime (always fp32, change 0): {', '.join(fixed)}")
    return Sensitivity(omega, "empirical", tuple(notes), scale, ref)
