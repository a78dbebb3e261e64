"""Give every plannable functional op a module at the FQN the planner named it, so a plan applies.

The planner keys functional GEMMs (`torch.matmul`, `a @ b`, `torch.bmm`, `F.linear`,
`F.conv2d`) as `<enclosing module>.<fn>_<k>` (models/tracing.py). A plan that lowers one names
a module that does not exist in the user's model. `make_applicable` fx-traces the model with
the planner's own tracer, computes the names exactly as `trace` does, and replaces each such
call by a call of a small module registered at that FQN: `MatMul` for matmul/@/bmm,
`FunctionalLinear` / `FunctionalConv2d` for F.linear / F.conv2d (the weight stays the user's
Parameter under its own name and arrives as an argument). The result is an fx GraphModule
with the same parameters (the very same objects), which `apply_plan` swaps like any model.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.fx as fx
from torch import nn

from qsync_opt.errors import RuntimeSetupError
from qsync_opt.models import flops
from qsync_opt.models.from_spec import input_maker
from qsync_opt.models.layers import FunctionalConv2d, FunctionalLinear, MatMul
from qsync_opt.models.spec import ModelJob
from qsync_opt.models.tracing import op_names, symbolic_trace

REWRITABLE = {"matmul": "matmul", "bmm": "bmm", "linear": "linear", "conv2d": "conv2d"}
"""Function names (as trace names them) that get a module."""


def make_applicable(module: nn.Module, example_inputs, *, leaf_modules: Iterable = (),
                    fqns: "set[str] | None" = None) -> nn.Module:
    """`module` with a module at the planner's FQN of each functional GEMM (only those in `fqns`, if given).

    Returns `module` itself when nothing needs rewriting. `example_inputs` only drive shape
    recording (any device, `meta` included) so the op names match the planner's exactly.
    """
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    gm = symbolic_trace(module, leaf_modules, type(module).__name__)
    names = op_names(gm, inputs)
    changed = False
    for n in list(gm.graph.nodes):
        if n.op not in ("call_function", "call_method") or n.name not in names:
            continue
        fqn = names[n.name]
        if flops.function_name(n.target) not in REWRITABLE or (fqns is not None and fqn not in fqns):
            continue
        new = _module_for(n, fqn)
        _register(gm, fqn, new)
        with gm.graph.inserting_after(n):
            call = gm.graph.call_module(fqn, args=_call_args(n))
        call.meta = dict(n.meta)
        n.replace_all_uses_with(call)
        gm.graph.erase_node(n)
        changed = True
    if not changed:
        return module
    gm.graph.lint()
    gm.recompile()
    return gm


def _arg(n: fx.Node, i: int, name: str, default=None):
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(name, default)


def _module_for(n: fx.Node, fqn: str) -> nn.Module:
    fn = flops.function_name(n.target)
    if fn in ("matmul", "bmm"):
        return MatMul()
    if fn == "linear":
        return FunctionalLinear()
    geometry = {k: _arg(n, i, k, d) for i, (k, d) in enumerate((("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1)), 3)}
    dynamic = [k for k, v in geometry.items() if isinstance(v, fx.Node)]
    if dynamic:
        raise RuntimeSetupError(f"{fqn}: F.conv2d's {dynamic} are computed at run time, so the call cannot become a "
                                "module; pass constants, or use nn.Conv2d")
    return FunctionalConv2d(**geometry)


def _call_args(n: fx.Node) -> tuple:
    fn = flops.function_name(n.target)
    if n.op == "call_method":  # a.matmul(b)
        return (n.args[0], n.args[1])
    if fn in ("matmul", "bmm"):
        return (_arg(n, 0, "input"), _arg(n, 1, "other") if fn == "matmul" else _arg(n, 1, "mat2"))
    return (_arg(n, 0, "input"), _arg(n, 1, "weight"), _arg(n, 2, "bias"))


def _register(gm: fx.GraphModule, fqn: str, new: nn.Module) -> None:
    *parents, leaf = fqn.split(".")
    owner: nn.Module = gm
    for part in parents:  # e.g. "root" for ops in the model's own forward, or a module fx did not copy
        child = getattr(owner, part, None)
        if child is None:
            child = nn.Module()
            owner.add_module(part, child)
        elif not isinstance(child, nn.Module):
            raise RuntimeSetupError(f"{fqn}: {part!r} is an attribute, not a module; cannot place the op's module there")
        owner = child
    if hasattr(owner, leaf):
        raise RuntimeSetupError(f"{fqn}: the model already has an attribute {leaf!r} there; rename it")
    owner.add_module(leaf, new)


def applicable_model(module: nn.Module, spec: ModelJob, plan_or_mapping) -> nn.Module:
    """`module`, rewritten so every FQN the plan names (any group) that is not already a module exists.

    The trainer and the launcher's dry run call this before `apply_plan`; a plan without
    functional ops leaves the module untouched.
    """
    if hasattr(plan_or_mapping, "groups"):  # a whole plan
        wanted = {fqn for g in plan_or_mapping.groups.values() for fqn in g.precisions}
    else:
        wanted = set(plan_or_mapping)
    wanted -= {name for name, _ in module.named_modules()}
    if not wanted:
        return module
    param = next(module.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    inputs = tuple(t.to(device) for t in input_maker(spec)(1, torch.Generator().manual_seed(0)))
    return make_applicable(module, inputs, leaf_modules=spec.model.leaf_modules, fqns=wanted)
