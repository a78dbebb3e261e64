"""The graph walk of models.tracing: an fx graph and its recorded values to the planner's OpGraph.

It keeps costed operators, drops view-like nodes while passing their data-flow through, names each
op (module FQN, `<fqn>@<k>` for a repeated call, `<enclosing>.<fn>_<k>` for functional ops), counts
each parameter once, and derives edges, selectable edges (crossing at most MAX_MERGES residual
merges), edge numels and depths. models.tracing (fx) and models.export_trace (torch.export) both
build their OpGraph here; training.predictor.profiler reuses its classification and naming.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.fx as fx
from torch import nn

from qsync_opt.models import flops
from qsync_opt.models.graph import OpGraph, OpNode
from qsync_opt.models.hf_types import is_hf_conv1d
from qsync_opt.models.layers import FUNCTIONAL_LAYERS


def enclosing_module(n: fx.Node) -> str:
    stack = n.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return path or "root"
    return "root"


def carries_data(values, n: fx.Node) -> bool:
    return values[n.name][0] in ("tensor", "tensors", "param")


def _numel_of(values, n: fx.Node) -> int:
    kind, shape, _ = values[n.name]
    shapes = shape if kind == "tensors" else (shape,)
    return sum(flops.numel(s) for s in shapes)


def build_op_graph(gm: fx.GraphModule, values: dict, model_name: str, batch_size: int, names_out: dict | None = None,
           pin_functional: bool = False) -> OpGraph:
    """The OpGraph of an fx graph; `pin_functional`: functional GEMMs are not selectable (no module to swap)."""
    nodes = list(gm.graph.nodes)
    act: dict[str, bool] = {}  # an activation: from a model input or an op, not a constant
    kept_src: dict[str, tuple[str, ...]] = {}  # kept ops whose output reaches this node
    # selectable ops reaching a node via non-selectable ops -> residual merges crossed on the way
    sel_src: dict[str, dict[str, int]] = {}
    param_src: dict[str, tuple[str, ...]] = {}  # get_attr parameters reaching it via dropped nodes
    names: dict[str, str] = {} if names_out is None else names_out  # fx node name -> OpNode name
    used: set[str] = set()
    counters: dict[tuple[str, str], int] = {}
    claimed: set[int] = set()  # id() of parameters already counted (tied weights count once)
    ops: list[OpNode] = []
    depth: dict[str, int] = {}
    edges: list[tuple[str, str]] = []
    sel_edges: dict[tuple[str, str], int] = {}

    def union(groups) -> tuple[str, ...]:
        return tuple(dict.fromkeys(x for g in groups for x in g))

    for n in nodes:
        data_in = [u for u in n.all_input_nodes if carries_data(values, u)]
        kind_v = values.get(n.name, ("other", (), None))
        is_tensor = kind_v[0] in ("tensor", "tensors")
        act[n.name] = (n.op == "placeholder" and is_tensor) or (
            is_tensor and any(act[u.name] for u in data_in)
        )
        op = classify_op(gm, n, values, act, data_in)
        act[n.name] = act[n.name] or (op is not None and is_tensor)  # an op's output is an activation
        if op is None:  # dropped: pass data-flow through
            kept_src[n.name] = union(kept_src.get(u.name, ()) for u in data_in)
            sel_src[n.name] = _merge_sources(sel_src, data_in, act, merge=False)
            own = (n.target,) if n.op == "get_attr" and kind_v[0] == "param" else ()
            param_src[n.name] = union([own, *(param_src.get(u.name, ()) for u in data_in)])
            continue
        kind, module, ins = op
        name, repeated = name_op(n, used, counters)
        names[n.name] = name
        selectable = flops.is_selectable(kind) and not repeated and not (pin_functional and module is None)
        targets = union(param_src.get(u.name, ()) for u in data_in)
        params = _params(gm, n, module, targets)
        new = [p for p in params if id(p) not in claimed]
        claimed.update(id(p) for p in new)
        preds = union(kept_src.get(u.name, ()) for u in data_in)
        depth[name] = max((depth[names[p]] + 1 for p in preds), default=0)
        node = _make_node(n, name, kind, selectable, module, ins, values, new, depth[name])
        if module is None or isinstance(module, FUNCTIONAL_LAYERS):
            node = replace(node, weight_fqn=_weight_target(gm, targets, params))
        edges.extend((names[p], name) for p in preds)
        if selectable:
            for u in data_in:
                for a in sel_src.get(u.name, ()):
                    key = (names[a], name)
                    sel_edges[key] = sel_edges.get(key, 0) + _numel_of(values, u)
        ops.append(node)
        kept_src[n.name] = (n.name,)
        sel_src[n.name] = {n.name: 0} if selectable else _merge_sources(sel_src, data_in, act, merge=True)
        param_src[n.name] = ()
    return OpGraph(
        model=model_name,
        batch_size=batch_size,
        nodes=tuple(ops),
        edges=tuple(edges),
        selectable_edges=tuple(sel_edges),
        edge_numel=sel_edges,
        depth=(max(depth.values()) + 1) if depth else 0,
    )


MAX_MERGES = 1
"""Residual merges a cast edge may cross. A residual stream joins every layer to every later
one; counting a cast on each such pair would charge the same tensor conversion many times.
Crossing one merge keeps the real producer -> consumer pairs (conv3 -> next block's conv1,
an attention output projection -> the next layer's QKV) and drops the long-range ones."""


def _merge_sources(sel_src, data_in, act, merge: bool) -> dict[str, int]:
    """Selectable sources reaching a node; an op joining two activations counts as a merge."""
    joins = merge and sum(1 for u in data_in if act.get(u.name)) >= 2
    out: dict[str, int] = {}
    for u in data_in:
        for a, m in sel_src.get(u.name, {}).items():
            m += joins
            if m <= MAX_MERGES and m < out.get(a, MAX_MERGES + 1):
                out[a] = m
    return out


def classify_op(gm, n: fx.Node, values, act, data_in):
    """(kind, module or None, costed input nodes) for a kept op; None for a dropped node."""
    if n.op in ("placeholder", "output", "get_attr"):
        return None
    if n.op == "call_module":
        m = gm.get_submodule(n.target)
        if isinstance(m, flops.VIEW_MODULES):
            return None
        ins = [u for u in data_in if values[u.name][0] in ("tensor", "tensors")]
        return flops.module_kind(m), m, ins
    if values[n.name][0] not in ("tensor", "tensors"):
        return None
    if flops.is_dropped(n.target):
        return None
    ins = [u for u in data_in if act[u.name]]
    has_param = any(values[u.name][0] == "param" for u in n.all_input_nodes)
    if not ins and not has_param:
        return None  # works on constants/buffers only (masks, position ids)
    return flops.function_kind(n.target), None, ins


def name_op(n: fx.Node, used: set[str], counters: dict) -> tuple[str, bool]:
    if n.op == "call_module":
        base, k = str(n.target), 0
        name = base
        while name in used:
            k += 1
            name = f"{base}@{k}"
        used.add(name)
        return name, k > 0
    encl, fn = enclosing_module(n), flops.function_name(n.target)
    k = counters.get((encl, fn), 0)
    while f"{encl}.{fn}_{k}" in used:
        k += 1
    counters[(encl, fn)] = k + 1
    name = f"{encl}.{fn}_{k}"
    used.add(name)
    return name, False


def _weight_target(gm, targets, params) -> str | None:
    """FQN of the first parameter a functional op reads (its weight), if any."""
    ids = {id(p) for p in params}
    for t in targets:
        obj = gm
        for part in str(t).split("."):
            obj = getattr(obj, part)
        if id(obj) in ids:
            return str(t)
    return None


def _params(gm, n: fx.Node, module, attr_targets) -> list[nn.Parameter]:
    if module is not None and not isinstance(module, FUNCTIONAL_LAYERS):
        return list(module.parameters())  # a leaf: its whole subtree is this one op
    out = []
    for t in attr_targets:
        obj = gm
        for part in str(t).split("."):
            obj = getattr(obj, part)
        if isinstance(obj, nn.Parameter):
            out.append(obj)
    return out


def _make_node(n, name, kind, selectable, module, ins, values, new_params, depth) -> OpNode:
    input_shapes = tuple(
        s for u in ins for s in (values[u.name][1] if values[u.name][0] == "tensors" else (values[u.name][1],))
    )
    kind_v, out_shape, _ = values[n.name]
    output_shape = out_shape[0] if kind_v == "tensors" else out_shape
    weight_shape, has_bias, window = None, False, None
    if module is not None and not isinstance(module, FUNCTIONAL_LAYERS):
        w = getattr(module, "weight", None)
        weight_shape = tuple(w.shape) if isinstance(w, torch.Tensor) else None
        if weight_shape is not None and is_hf_conv1d(module):  # stored (in, out): the GEMM's (out, in)
            weight_shape = weight_shape[::-1]
        has_bias = isinstance(getattr(module, "bias", None), torch.Tensor)
        window = flops.pool_window(module) if kind == "pool" else None
    elif kind in ("linear", "conv1d", "conv2d", "embedding"):  # a functional call, or a FUNCTIONAL_LAYERS module
        w = n.args[1] if len(n.args) > 1 else n.kwargs.get("weight")
        weight_shape = values[w.name][1] if isinstance(w, fx.Node) else None
        b = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
        has_bias = isinstance(b, fx.Node)
    elif kind == "pool" and "adaptive" not in flops.function_name(n.target):
        ks = n.args[1] if len(n.args) > 1 else n.kwargs.get("kernel_size", 1)
        dims = 1 if flops.function_name(n.target).endswith("1d") else 2
        window = flops.numel(ks) if isinstance(ks, (tuple, list)) else int(ks) ** dims
    if weight_shape is None and new_params:
        weight_shape = tuple(new_params[0].shape)
    pcount = sum(p.numel() for p in new_params)
    all_params = pcount if module is None or isinstance(module, FUNCTIONAL_LAYERS) else sum(p.numel() for p in module.parameters())
    cost = flops.op_cost(
        kind, input_shapes, output_shape,
        weight_shape=weight_shape, has_bias=has_bias, param_count=all_params, window=window,
    )
    return OpNode(
        name=name, kind=kind, selectable=selectable, input_shapes=input_shapes,
        output_shape=tuple(output_shape), fwd_flops=int(cost.fwd_flops), bwd_flops=int(cost.bwd_flops),
        param_count=int(pcount), saved_bytes=int(cost.saved_bytes), depth=depth,
        weight_shape=weight_shape,
    )
