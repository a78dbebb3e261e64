"""torch.fx tracing of an nn.Module into the planner's OpGraph.

Three passes: symbolic tracing with a Tracer that treats standard and user-named modules as
leaves and remembers which module broke tracing; a shape-recording Interpreter run on the
example inputs (any device, `meta` included, so big models trace without compute); and a
walk over the fx graph that keeps costed operators, drops view-like nodes while passing
their data-flow through, and derives edges, selectable edges and depths.

Naming: a call_module node is keyed by its module FQN; a second call of the same module is
`<fqn>@<k>` and is not selectable (a plan has one precision per module). Functional ops are
`<fqn of the enclosing module, or 'root'>.<fn>_<k>`, k counting per (module, fn) in code order.

Depth is the longest-path level from the sources (ops with no op predecessor, e.g. those
reading the model input, are 0), so every edge goes from a lower to a higher depth.
`edge_numel[(a, b)]` is the numel of b's input tensor(s) through which a's output reaches b.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import torch
import torch.fx as fx
from torch import nn

from qsync_opt.errors import ModelError, SpecError
from qsync_opt.models import flops
from qsync_opt.models.capture_lock import capturing
from qsync_opt.models.graph import OpGraph, OpNode
from qsync_opt.models.layers import FUNCTIONAL_LAYERS, MatMul

_CULPRIT = "_qsync_trace_culprit"


class _Tracer(fx.Tracer):
    """Standard leaves + MatMul + user leaves; tags a failure with the innermost module FQN."""

    def __init__(self, extra_leaf: Callable[[nn.Module, str], bool]):
        super().__init__()
        self._extra_leaf = extra_leaf

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, (MatMul, *FUNCTIONAL_LAYERS)) or self._extra_leaf(m, module_qualified_name):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m, forward, args, kwargs):
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception as e:
            if not hasattr(e, _CULPRIT):
                try:
                    setattr(e, _CULPRIT, (self.path_of_module(m), type(m).__name__))
                except Exception:  # noqa: BLE001 - an exception type without a __dict__
                    pass
            raise


class _Recorder(fx.Interpreter):
    """Runs the graph once and keeps, per node, what it produced (shape, not the data)."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.values: dict[str, object] = {}

    def run_node(self, n: fx.Node):
        try:
            result = super().run_node(n)
        except Exception as e:
            where = _enclosing(n)
            reason = str(e).split("\n\nWhile executing")[0].strip()
            raise ModelError(
                f"running the example inputs through the traced model failed at "
                f"`{n.format_node()}` (in module {where!r}): {type(e).__name__}: {reason}. "
                "Check that example_inputs (model.input_shape / training.seq_len) fit the model."
            ) from e
        self.values[n.name] = _describe(result)
        if n.op == "get_attr" and isinstance(result, nn.Parameter):
            self.values[n.name] = ("param", tuple(result.shape), result)
        return result


def _describe(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), None)
    if isinstance(v, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in v):
        return ("tensors", tuple(tuple(x.shape) for x in v if isinstance(x, torch.Tensor)), None)
    return ("other", (), None)


def _enclosing(n: fx.Node) -> str:
    stack = n.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return path or "root"
    return "root"


def _leaf_matcher(module: nn.Module, leaf_modules: Iterable) -> Callable[[nn.Module, str], bool]:
    types: list[type] = []
    names: set[str] = set()
    for item in leaf_modules:
        if isinstance(item, type) and issubclass(item, nn.Module):
            types.append(item)
        elif isinstance(item, str):
            names.add(item)
        else:
            raise SpecError(
                f"model.leaf_modules: {item!r} is neither a module name nor an nn.Module class; "
                "give module FQNs (e.g. 'encoder.layer.0') or class names (e.g. 'MyBlock')."
            )
    known: set[str] = set()
    for fqn, m in module.named_modules():
        known |= {fqn, type(m).__name__, f"{type(m).__module__}.{type(m).__qualname__}"}
    for s in sorted(names - known):
        near = difflib.get_close_matches(s, sorted(k for k in known if k), n=3)
        hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
        raise SpecError(
            f"model.leaf_modules: {s!r} matches no submodule FQN or class name of the model.{hint}"
        )
    tps = tuple(types)

    def is_leaf(m: nn.Module, fqn: str) -> bool:
        cls = type(m)
        return (
            isinstance(m, tps)
            or fqn in names
            or cls.__name__ in names
            or f"{cls.__module__}.{cls.__qualname__}" in names
        )

    return is_leaf


def symbolic_trace(module: nn.Module, leaf_modules: Iterable = (), model_name: str = "custom"):
    """fx-trace `module`; a failure becomes a ModelError naming the module that broke it."""
    tracer = _Tracer(_leaf_matcher(module, leaf_modules))
    try:
        with capturing(tracer):  # fx patches torch process-wide while it traces (capture_lock.py)
            graph = tracer.trace(module)
    except Exception as e:
        fqn, cls = getattr(e, _CULPRIT, ("", type(module).__name__))
        msg = f"{type(e).__name__}: {e}".strip()
        if fqn:
            raise ModelError(
                f"cannot trace model {model_name!r}: module {fqn!r} ({cls}) broke symbolic tracing "
                f"({msg}). Its forward likely has data-dependent control flow; trace it as one "
                f"opaque op with leaf_modules=[{fqn!r}] (or its class name {cls!r}), i.e. the "
                "spec's model.leaf_modules field."
            ) from e
        raise ModelError(
            f"cannot trace model {model_name!r}: its own forward ({cls}) broke symbolic tracing "
            f"({msg}). leaf_modules cannot make the root opaque: move the data-dependent part "
            "into a submodule and list that in model.leaf_modules."
        ) from e
    return fx.GraphModule(tracer.root, graph, type(module).__name__)


def record_shapes(gm: fx.GraphModule, inputs: Sequence) -> dict[str, tuple]:
    """Run the graph once under no_grad in eval mode (BN statistics untouched), keep shapes."""
    modes = {m: m.training for m in gm.modules()}
    gm.eval()
    try:
        with torch.no_grad():
            rec = _Recorder(gm)
            rec.run(*inputs)
    finally:
        for m, t in modes.items():
            m.train(t)
    return rec.values


def trace(
    module: nn.Module,
    example_inputs,
    *,
    model_name: str = "custom",
    leaf_modules: Iterable = (),
) -> OpGraph:
    """Trace `module` on `example_inputs` (a tensor or a tuple of forward arguments) to an OpGraph."""
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    if first is None or first.dim() == 0:
        raise SpecError(
            f"example_inputs: need at least one tensor with a leading batch dimension, got "
            f"{[type(x).__name__ for x in inputs]}; pass e.g. (torch.randn(B, 3, 224, 224),)."
        )
    gm = symbolic_trace(module, leaf_modules, model_name)
    values = record_shapes(gm, inputs)
    return _build(gm, values, model_name, int(first.shape[0]))


def op_names(gm: fx.GraphModule, inputs: Sequence) -> dict[str, str]:
    """fx node name -> OpNode name for every kept op of `gm`: the names a plan uses, computed as trace does."""
    names: dict[str, str] = {}
    _build(gm, record_shapes(gm, tuple(inputs)), "names", 1, names_out=names)
    return names


# --- graph walk ---------------------------------------------------------------------------
def _carries_data(values, n: fx.Node) -> bool:
    return values[n.name][0] in ("tensor", "tensors", "param")


def _numel_of(values, n: fx.Node) -> int:
    kind, shape, _ = values[n.name]
    shapes = shape if kind == "tensors" else (shape,)
    return sum(flops._numel(s) for s in shapes)


def _build(gm: fx.GraphModule, values: dict, model_name: str, batch_size: int, names_out: dict | None = None) -> OpGraph:
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
        data_in = [u for u in n.all_input_nodes if _carries_data(values, u)]
        kind_v = values.get(n.name, ("other", (), None))
        is_tensor = kind_v[0] in ("tensor", "tensors")
        act[n.name] = (n.op == "placeholder" and is_tensor) or (
            is_tensor and any(act[u.name] for u in data_in)
        )
        op = _classify(gm, n, values, act, data_in)
        act[n.name] = act[n.name] or (op is not None and is_tensor)  # an op's output is an activation
        if op is None:  # dropped: pass data-flow through
            kept_src[n.name] = union(kept_src.get(u.name, ()) for u in data_in)
            sel_src[n.name] = _merge_sources(sel_src, data_in, act, merge=False)
            own = (n.target,) if n.op == "get_attr" and kind_v[0] == "param" else ()
            param_src[n.name] = union([own, *(param_src.get(u.name, ()) for u in data_in)])
            continue
        kind, module, ins = op
        name, repeated = _name(n, used, counters)
        names[n.name] = name
        selectable = flops.is_selectable(kind) and not repeated
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


def _classify(gm, n: fx.Node, values, act, data_in):
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
    if flops.function_name(n.target) in flops.DROPPED_NAMES:
        return None
    ins = [u for u in data_in if act[u.name]]
    has_param = any(values[u.name][0] == "param" for u in n.all_input_nodes)
    if not ins and not has_param:
        return None  # works on constants/buffers only (masks, position ids)
    return flops.function_kind(n.target), None, ins


def _name(n: fx.Node, used: set[str], counters: dict) -> tuple[str, bool]:
    if n.op == "call_module":
        base, k = str(n.target), 0
        name = base
        while name in used:
            k += 1
            name = f"{base}@{k}"
        used.add(name)
        return name, k > 0
    encl, fn = _enclosing(n), flops.function_name(n.target)
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
        window = flops._numel(ks) if isinstance(ks, (tuple, list)) else int(ks) ** dims
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

