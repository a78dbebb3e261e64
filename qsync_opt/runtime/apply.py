"""apply_plan / strip: swap a model's selectable modules for quantized ones by FQN, and back.

Every plan entry is checked before anything is touched, and all problems are reported in one
error: unknown FQNs with near matches, FQNs of functional ops (which have no module to swap),
and modules of a type the runtime cannot swap. An fp32 entry leaves (or restores) the plain
module, so an all-fp32 plan costs nothing.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, Union

import torch
from torch import nn

from qsync_opt.errors import RuntimeSetupError
from qsync_opt.models.fingerprint import GraphFingerprint, fingerprint_mismatch, op_signature
from qsync_opt.models.flops import MODULE_KINDS
from qsync_opt.models.hf_types import is_hf_conv1d
from qsync_opt.precision import PRECISIONS
from qsync_opt.runtime.qfunctions import BOUNDARY
from qsync_opt.runtime.qmodules import SWAPPABLE, QuantizedModule
from qsync_opt.runtime.recipe import Recipe
from qsync_opt.runtime.support import precision_refusal



class GroupPrecisions(Protocol):
    """One group's part of a plan: the precision of each operator it names, by FQN."""

    @property
    def precisions(self) -> Mapping[str, str]: ...


class PrecisionPlan(Protocol):
    """What `apply_plan` reads of a whole plan (a training `Plan` is one): a FQN -> precision map per
    group, the runtime boundary it was costed for, the fingerprint of the graph it was solved for (or
    None), and the job and model names its errors quote."""

    @property
    def groups(self) -> Mapping[str, GroupPrecisions]: ...

    @property
    def boundary(self) -> str: ...

    @property
    def fingerprint(self) -> GraphFingerprint | None: ...

    @property
    def job(self) -> str: ...

    @property
    def model(self) -> str: ...


PlanOrMapping = Union[PrecisionPlan, GroupPrecisions, Mapping[str, str]]
"""What `apply_plan` takes: a whole plan (with a group), one group's plan, or a FQN -> precision map."""

_FUNCTIONAL = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*_\d+$")


@dataclass(frozen=True)
class Change:
    """One plan entry as applied (or, with dry_run, as it would be)."""

    fqn: str
    old_type: str
    old_precision: str
    new_precision: str
    new_type: str
    note: str = ""


def base_type(module: nn.Module) -> type:
    """The plain class of a module, looking through a quantized wrapper."""
    return module._qsync_original if isinstance(module, QuantizedModule) else type(module)


def precision_of(module: nn.Module) -> str:
    return module.recipe.precision if isinstance(module, QuantizedModule) else "fp32"


def selectable_modules(module: nn.Module) -> dict[str, nn.Module]:
    """FQN -> module for every module the runtime can swap, in registration order."""
    return {n: m for n, m in module.named_modules(remove_duplicate=False) if base_type(m) in SWAPPABLE}


def current_precisions(module: nn.Module) -> dict[str, str]:
    """FQN -> precision each selectable module runs at now."""
    return {n: precision_of(m) for n, m in selectable_modules(module).items()}


def is_plan(obj) -> bool:
    """A whole plan (a `PrecisionPlan`: per-group `groups`, a `fingerprint`)."""
    return not isinstance(obj, Mapping) and hasattr(obj, "groups") and hasattr(obj, "fingerprint")


def is_group_plan(obj) -> bool:
    """One group's plan (a `GroupPrecisions`: its `precisions` map)."""
    return not isinstance(obj, Mapping) and hasattr(obj, "precisions") and not hasattr(obj, "groups")


def resolve_mapping(plan_or_mapping: PlanOrMapping, group: str | None) -> dict[str, str]:
    """A plain FQN -> precision map from a whole plan (+ group), one group's plan, or a mapping."""
    if is_plan(plan_or_mapping):
        if group is None:
            if len(plan_or_mapping.groups) != 1:
                raise RuntimeSetupError(
                    f"group=None but the plan has {len(plan_or_mapping.groups)} groups "
                    f"({', '.join(plan_or_mapping.groups)}); pass group=<one of them>")
            group = next(iter(plan_or_mapping.groups))
        if group not in plan_or_mapping.groups:
            near = difflib.get_close_matches(group, list(plan_or_mapping.groups), n=3)
            raise RuntimeSetupError(
                f"group={group!r} is not in the plan; groups: {', '.join(plan_or_mapping.groups)}"
                + (f" (did you mean {', '.join(near)}?)" if near else ""))
        return dict(plan_or_mapping.groups[group].precisions)
    if is_group_plan(plan_or_mapping):
        return dict(plan_or_mapping.precisions)
    if isinstance(plan_or_mapping, Mapping):
        return {str(k): v for k, v in plan_or_mapping.items()}
    raise RuntimeSetupError(
        f"plan_or_mapping has type {type(plan_or_mapping).__name__}; pass a Plan, a GroupPlan or a dict FQN -> precision")


def check_boundary(plan: PrecisionPlan) -> None:
    """Refuse a plan costed for another runtime.boundary than the one this runtime implements
    ('fp32': every quantized operator returns fp32), whose predicted times would not hold here."""
    if plan.boundary != BOUNDARY:
        raise RuntimeSetupError(
            f"plan for job {plan.job!r} was costed for runtime.boundary={plan.boundary!r}, but this runtime "
            f"returns fp32 from every quantized operator (boundary {BOUNDARY!r}); re-solve the spec with "
            f"runtime.boundary: {BOUNDARY} (the default)")


def module_fingerprint_ops(module: nn.Module) -> dict[str, str]:
    """FQN -> 'kind[weight shape]' of every swappable module, as `plan.graph_fingerprint` writes it."""
    out = {}
    for fqn, m in selectable_modules(module).items():
        cls = base_type(m)
        w = getattr(m, "weight", None)
        shape = tuple(w.shape) if isinstance(w, nn.Parameter | torch.Tensor) else None
        if is_hf_conv1d(cls):  # transformers' Conv1D: a linear layer, weight stored (in, out)
            kind, shape = "linear", shape[::-1] if shape else shape
        else:
            kind = next(k for t, k in MODULE_KINDS if issubclass(cls, t))
        out[fqn] = op_signature(kind, shape)
    return out


def check_fingerprint(module: nn.Module, plan: PrecisionPlan) -> None:
    """RuntimeSetupError naming the first difference when `plan` was solved for another model."""
    if plan.fingerprint is None:
        return
    why = fingerprint_mismatch(plan.fingerprint, module_fingerprint_ops(module))
    if why is not None:
        raise RuntimeSetupError(
            f"plan for model {plan.model!r} does not fit this {type(module).__name__}: {why}; "
            "solve a plan for this model (qsync-opt solve), or pass force=True (--force) to apply it anyway")


def _problems(module: nn.Module, mapping: dict[str, str], strict: bool) -> list[str]:
    named = dict(module.named_modules(remove_duplicate=False))
    selectable = selectable_modules(module)
    supported = ", ".join(t.__name__ for t in SWAPPABLE)
    out = []
    for fqn, prec in mapping.items():
        if prec not in PRECISIONS:
            out.append(f"{fqn or '<root>'}: precision {prec!r} is unknown; use one of {', '.join(PRECISIONS)}")
        if fqn in named:
            kind = base_type(named[fqn])
            if kind not in SWAPPABLE:
                out.append(f"{fqn or '<root>'}: module type {kind.__name__} cannot be swapped; supported types: {supported}")
            continue
        parent = fqn.rpartition(".")[0]
        if _FUNCTIONAL.match(fqn.rpartition(".")[2]) and parent in named:
            out.append(
                f"{fqn}: names a functional op, not a module; only module ops can be swapped — route the "
                f"product through qsync_opt.models.layers.MatMul (a module) so it gets an FQN, or drop the entry")
            continue
        near = difflib.get_close_matches(fqn, list(selectable), n=3, cutoff=0.5)
        hint = f"; near matches: {', '.join(near)}" if near else f"; selectable modules include: {', '.join(list(selectable)[:5])}"
        out.append(f"{fqn}: no such module in {type(module).__name__}{hint}")
    if strict:
        missing = [n for n in selectable if n not in mapping]
        if missing:
            out.append(f"strict=True and the plan has no entry for {len(missing)} selectable module(s): "
                       f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}; add them or pass strict=False")
    return out


_OPTIONS = {
    "kernels": ("auto", "templated", "torch"),
    "weight_granularity": ("per_tensor", "per_channel"),
    "backward_precision": ("bf16", "fp16", "fp32", "fp8"),
    "rounding": ("nearest", "stochastic"),
}


def _check_options(**given):
    for name, value in given.items():
        if value not in _OPTIONS[name]:
            raise RuntimeSetupError(f"{name}={value!r} is not accepted; use one of {', '.join(_OPTIONS[name])}")


def apply_plan(
    module: nn.Module,
    plan_or_mapping: PlanOrMapping,
    group: str | None = None,
    *,
    dry_run: bool = False,
    kernels: str = "auto",
    weight_granularity: str = "per_tensor",
    backward_precision: str = "bf16",
    rounding: str = "nearest",
    strict: bool = False,
    force: bool = False,
    device=None,
    op_kernels: Mapping[str, str] | None = None,
):
    """Swap the modules named by the plan, in place; return the module (the new one if the root itself was swapped).

    With dry_run=True nothing is modified and the list of `Change`s is returned instead.
    Modules absent from the plan are left as they are (unless strict=True, which is an error).
    A Plan whose graph fingerprint differs from the module's is refused unless force=True.
    With `device` (a DeviceSpec), a precision that device's runtime cannot run is refused too, and the backward
    runs in `device.backward_format(backward_precision)`, the format the planner priced (a T4 runs fp16 where
    bf16 is asked; 'fp8' falls to a 16-bit format where the device has no fp8).
    `op_kernels`: FQN -> kernels setting for the modules whose implementation a profile measured faster
    (a plan's GroupPlan.kernels, training/predictor/measured_dispatch.py); the others run `kernels`.
    """
    _check_options(kernels=kernels, weight_granularity=weight_granularity,
                   backward_precision=backward_precision, rounding=rounding)
    op_kernels = dict(op_kernels or {})
    for fqn, k in op_kernels.items():
        if k not in _OPTIONS["kernels"]:
            raise RuntimeSetupError(f"op_kernels[{fqn!r}]={k!r} is not accepted; use one of "
                                    f"{', '.join(_OPTIONS['kernels'])}")
    if is_plan(plan_or_mapping):
        check_boundary(plan_or_mapping)
    mapping = resolve_mapping(plan_or_mapping, group)
    if is_plan(plan_or_mapping) and not force:
        check_fingerprint(module, plan_or_mapping)
    problems = _problems(module, mapping, strict)
    if device is not None:
        problems += [f"{fqn}: {why}" for fqn, p in mapping.items() if p in PRECISIONS
                     and (why := precision_refusal(device, p)) is not None]
    if device is not None:
        backward_precision = device.backward_format(backward_precision)
    if problems:
        raise RuntimeSetupError(f"cannot apply plan to {type(module).__name__} ({len(problems)} problem"
                                f"{'s' * (len(problems) > 1)}):\n  - " + "\n  - ".join(problems))
    named = dict(module.named_modules(remove_duplicate=False))
    on_cuda = any(p.is_cuda for p in module.parameters())
    changes, swaps = [], []
    for fqn, prec in mapping.items():
        old = named[fqn]
        plain_cls = base_type(old)
        if prec == "fp32":
            new_cls = plain_cls
        else:
            new_cls = SWAPPABLE[plain_cls]
            recipe = Recipe(prec, backward_precision, weight_granularity, rounding, op_kernels.get(fqn, kernels))
        note = "tf32 runs as plain fp32 on CPU tensors" if prec == "tf32" and not on_cuda else ""
        changes.append(Change(fqn, type(old).__name__, precision_of(old), prec, new_cls.__name__, note))
        swaps.append((fqn, old, None if prec == "fp32" else recipe))
    if dry_run:
        return changes
    for fqn, old, recipe in swaps:
        plain = old.to_float() if isinstance(old, QuantizedModule) else old
        new = plain if recipe is None else SWAPPABLE[type(plain)].from_float(plain, recipe)
        if new is old:
            continue
        if fqn == "":
            module = new
            continue
        parent_name, _, child = fqn.rpartition(".")
        setattr(module.get_submodule(parent_name), child, new)
    return module


def strip(module: nn.Module) -> nn.Module:
    """Restore every quantized module to its plain class with the same parameters; returns the module."""
    if isinstance(module, QuantizedModule):
        module = module.to_float()
    for fqn, sub in list(module.named_modules(remove_duplicate=False)):
        if isinstance(sub, QuantizedModule) and fqn:
            parent_name, _, child = fqn.rpartition(".")
            setattr(module.get_submodule(parent_name), child, sub.to_float())
    return module
