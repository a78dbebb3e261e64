"""Graph capture through torch.export, for models symbolic fx cannot follow (Hugging Face transformers).

`torch.export.export(model, args, strict=False)` runs the model's Python forward once at the
given shapes and records an ATen graph; unlike `torch.fx.symbolic_trace` it follows control
flow on shapes and slicing with sizes, which every `transformers` model has. Each node's
`meta["nn_module_stack"]` names the module call it ran in, so the planner's keys stay module
FQNs: `export_graph` rebuilds, from the ATen graph, the same kind of fx graph the symbolic
tracer makes. Every call of a module the tracer treats as a leaf (nn.Linear, nn.Embedding,
norms, activations, transformers' Conv1D, user leaf_modules, ...) becomes one `call_module`
node at that module's FQN; every other ATen op stays a `call_function` under the module it
ran in. `trace_walk.build_op_graph` then walks it exactly as it walks an fx trace (same naming, edges,
FLOPs and bytes), with one difference: functional GEMMs (`torch.matmul`, `F.linear` outside
a module) stay non-selectable, because the runtime can only swap modules and an exported
model cannot be rewritten by fx (`pinned_notes` says so in the plan).

Shapes come from the export's fake tensors: nothing is computed, the module's parameters and
buffers are not modified. Data-dependent control flow (`if x.sum() > 0`) fails here too; the
error names the innermost module whose forward was running.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx
from torch import nn

from qsync_opt.errors import ModelError
from qsync_opt.models import flops
from qsync_opt.models.graph import SELECTABLE_KINDS
from qsync_opt.models.hf_types import is_hf_conv1d
from qsync_opt.models.layers import FUNCTIONAL_LAYERS, MatMul

_CALL_SUFFIX = re.compile(r"@\d+$")


class OutputNotATensor(ModelError):
    """The captured model returns a container, not the logits tensor (the fix is model.output)."""


#: GEMM/embedding module types the runtime swaps: leaves by exact type only. A subclass with its own
#: forward (Falcon's FalconLinear, Gemma's scaled word embedding, OPT's offset positions) is captured
#: op by op instead: its GEMM or lookup becomes a functional op, kept at fp32 and named in the plan's notes.
_SWAPPED_EXACTLY = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)


def _is_leaf_type(m: nn.Module) -> bool:
    if isinstance(m, (MatMul, *FUNCTIONAL_LAYERS, *flops.VIEW_MODULES)) or is_hf_conv1d(m):
        return True
    if type(m) in _SWAPPED_EXACTLY:
        return True
    return any(isinstance(m, cls) for cls, kind in flops.MODULE_KINDS if not flops.is_selectable(kind))


class _Culprit:
    """Forward pre/post hooks on every module: the stack of module calls running right now."""

    def __init__(self, module: nn.Module):
        self.stack: list[tuple[str, str]] = []
        self.handles = []
        for fqn, m in module.named_modules():
            self.handles.append(m.register_forward_pre_hook(self._enter(fqn)))
            self.handles.append(m.register_forward_hook(self._leave))  # not always_call: a failure leaves its module on top

    def _enter(self, fqn):
        def hook(m, args):
            self.stack.append((fqn, type(m).__name__))

        return hook

    def _leave(self, m, args, out):
        if self.stack:
            self.stack.pop()

    def close(self) -> tuple[str, str] | None:
        where = self.stack[-1] if self.stack else None
        for h in self.handles:
            h.remove()
        return where


class _OpaqueLeaves:
    """User leaf modules as stand-ins during export: torch.export runs every forward it meets, so a
    leaf's own (possibly data-dependent) code is replaced, for the capture only, by a forward that
    returns zeros of the shapes an eager run recorded, anchored on its inputs (so the data-flow into
    the leaf and out of it is kept). The graph walk then makes the whole call one opaque op."""

    def __init__(self, module: nn.Module, inputs: Sequence, is_user_leaf):
        self.patched: list[nn.Module] = []
        leaves = {}
        for fqn, m in module.named_modules():
            if fqn and is_user_leaf(m, fqn) and not any(fqn.startswith(p + ".") for p in leaves):
                leaves[fqn] = m
        if not leaves:
            return
        outs: dict[str, list] = {fqn: [] for fqn in leaves}
        hooks = [m.register_forward_hook(lambda mod, a, o, f=fqn: outs[f].append(_shapes_of(o)))
                 for fqn, m in leaves.items()]
        modes = {m: m.training for m in module.modules()}
        try:
            module.eval()
            with torch.no_grad():
                module(*inputs)
        except Exception as e:
            raise ModelError(f"running the example inputs through the model (to size its leaf_modules) failed: "
                             f"{type(e).__name__}: {e}") from e
        finally:
            for h in hooks:
                h.remove()
            for m, t in modes.items():
                m.train(t)
        for fqn, m in leaves.items():
            calls = iter(outs[fqn])
            m.forward = functools.partial(_stand_in, calls, fqn)
            self.patched.append(m)

    def close(self):
        for m in self.patched:
            m.__dict__.pop("forward", None)


def _shapes_of(o):
    if isinstance(o, torch.Tensor):
        return (tuple(o.shape), o.dtype)
    if isinstance(o, (tuple, list)):
        return type(o)(_shapes_of(x) for x in o)
    raise ModelError(f"a leaf module returned a {type(o).__name__}; torch.export capture handles tensor or tuple outputs")


def _stand_in(calls, fqn, *args, **kwargs):
    try:
        shape = next(calls)
    except StopIteration:
        raise ModelError(f"leaf module {fqn!r} ran more often under torch.export than eagerly") from None
    anchor = None
    for a in [*args, *kwargs.values()]:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            t = (a * 0).sum()
            anchor = t if anchor is None else anchor + t

    def build(s):
        if isinstance(s, list | tuple) and not (len(s) == 2 and isinstance(s[1], torch.dtype)):
            return type(s)(build(x) for x in s)
        z = torch.zeros(s[0], dtype=s[1])
        return z + anchor if anchor is not None and z.is_floating_point() else z

    return build(shape)


def export_program(module: nn.Module, inputs: Sequence, model_name: str, is_user_leaf=None):
    """torch.export (non-strict) of `module` on `inputs`; a failure is a ModelError naming the module."""
    modes = {m: m.training for m in module.modules()}
    opaque = _OpaqueLeaves(module, inputs, is_user_leaf) if is_user_leaf is not None else None
    culprit = _Culprit(module)
    try:
        with torch.no_grad():
            return torch.export.export(module, tuple(inputs), strict=False)
    except Exception as e:
        where = culprit.close()
        culprit = None
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        fqn, cls = where if where else ("", type(module).__name__)
        place = f"module {fqn!r} ({cls})" if fqn else f"its own forward ({cls})"
        raise ModelError(
            f"cannot capture model {model_name!r} with torch.export: {place} failed ({reason}). "
            "Data-dependent control flow (branching on tensor values) cannot be captured at all; "
            f"make that module opaque with model.leaf_modules=[{fqn or cls!r}]"
            + ("" if fqn else " after moving the data-dependent part into a submodule")
        ) from e
    finally:
        if culprit is not None:
            culprit.close()
        if opaque is not None:
            opaque.close()
        for m, t in modes.items():
            m.train(t)


def _describe_val(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(int(s) for s in v.shape), None)
    if isinstance(v, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in v):
        return ("tensors", tuple(tuple(int(s) for s in x.shape) for x in v if isinstance(x, torch.Tensor)), None)
    return ("other", (), None)


class ExportedView:
    """What `trace_walk.build_op_graph` needs of a GraphModule: `.graph`, `get_submodule`, attribute access."""

    def __init__(self, module: nn.Module, graph: fx.Graph):
        self._module, self.graph = module, graph

    def get_submodule(self, target: str) -> nn.Module:
        return self._module.get_submodule(target)

    def __getattr__(self, name):
        return getattr(self._module, name)


def _stack_paths(n: fx.Node) -> list[tuple[str, str]]:
    """[(call key, module FQN)] of the module calls a node ran in, outermost first."""
    stack = n.meta.get("nn_module_stack") or {}
    return [(key, _CALL_SUFFIX.sub("", str(v[0]))) for key, v in stack.items()]


def export_graph(module: nn.Module, inputs: Sequence, is_user_leaf: Callable[[nn.Module, str], bool],
                 model_name: str = "custom") -> tuple[ExportedView, dict[str, tuple]]:
    """(graph view, node values) in the shape `trace_walk.build_op_graph` consumes, from torch.export."""
    ep = export_program(module, inputs, model_name, is_user_leaf)
    out_spec = ep.call_spec.out_spec
    if out_spec is not None and out_spec.type is not None:
        keys = out_spec.context if isinstance(out_spec.context, list) else None
        hint = f"'{keys[0]}'" if keys else "0"
        raise OutputNotATensor(
            f"model {model_name!r} returns a {out_spec.type.__name__}"
            + (f" (keys {', '.join(map(repr, keys))})" if keys else f" of {out_spec.num_leaves} tensors")
            + f", not one tensor of logits; set model.output: {hint.strip(chr(39))} in the spec (the key, "
            "attribute or tuple index of the logits), or return the logits tensor from forward")
    sig = ep.graph_signature
    params = dict(sig.inputs_to_parameters)
    buffers = dict(sig.inputs_to_buffers)
    consts = dict(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
    named = dict(module.named_modules())
    leaf_cache: dict[str, bool] = {}

    def is_leaf(path: str) -> bool:
        if path not in leaf_cache:
            m = named.get(path)
            leaf_cache[path] = m is not None and path != "" and (_is_leaf_type(m) or is_user_leaf(m, path))
        return leaf_cache[path]

    src = list(ep.graph.nodes)
    group_of: dict[fx.Node, tuple[str, str]] = {}  # node -> (call key, leaf FQN): its outermost leaf call
    for n in src:
        if n.op != "call_function":
            continue
        for key, path in _stack_paths(n):
            if is_leaf(path):
                group_of[n] = (key, path)
                break
    members: dict[tuple[str, str], list[fx.Node]] = {}
    for n in src:
        if n in group_of:
            members.setdefault(group_of[n], []).append(n)
    last_of = {g: ns[-1] for g, ns in members.items()}

    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    values: dict[str, tuple] = {}
    param_objs = dict(module.named_parameters(remove_duplicate=False))

    def emit(new: fx.Node, value, meta=None) -> fx.Node:
        values[new.name] = value
        if meta is not None:
            new.meta["nn_module_stack"] = meta
        return new

    def clean_stack(n: fx.Node) -> dict:
        return {key: (path, None) for key, path in _stack_paths(n)}

    for n in src:
        if n.op == "placeholder":
            if n.name in params:
                fqn = params[n.name]
                env[n] = emit(g.get_attr(fqn), ("param", tuple(n.meta["val"].shape), param_objs.get(fqn)))
            elif n.name in buffers or n.name in consts:
                fqn = buffers.get(n.name) or consts[n.name]
                env[n] = emit(g.get_attr(fqn), _describe_val(n.meta.get("val")))
            else:
                env[n] = emit(g.placeholder(n.name), _describe_val(n.meta.get("val")))
            continue
        if n.op == "output":
            g.output(fx.map_arg(n.args[0], lambda u: env.get(u)))
            continue
        if n.op != "call_function":
            continue
        grp = group_of.get(n)
        if grp is None:
            value = _describe_val(n.meta.get("val"))
            if value[0] == "tensor" and not _float_like(n) and not flops.is_dropped(n.target):
                value = ("other", (), None)  # index and mask arithmetic (position ids, attention masks): no data
            args = fx.map_arg(n.args, lambda u: env.get(u))
            kwargs = fx.map_arg(n.kwargs, lambda u: env.get(u))
            env[n] = emit(g.call_function(n.target, args, kwargs), value, clean_stack(n))
            continue
        if n is not last_of[grp]:
            continue
        inside = set(members[grp])
        ext_in = list(dict.fromkeys(u for m in members[grp] for u in m.all_input_nodes if u not in inside))
        outs = [m for m in members[grp] if any(u not in inside for u in m.users)]
        call_stack = {}
        for key, path in _stack_paths(n):
            call_stack[key] = (path, None)
            if key == grp[0]:
                break
        vals = [n2.meta.get("val") for n2 in outs]
        value = _describe_val(vals[0]) if len(outs) == 1 else _describe_val(tuple(vals))
        call = emit(g.call_module(grp[1], tuple(env[u] for u in ext_in if u in env)), value, call_stack)
        if len(outs) == 1:
            env[outs[0]] = call
        else:
            for i, o in enumerate(outs):
                env[o] = emit(g.call_function(operator.getitem, (call, i)), _describe_val(o.meta.get("val")), call_stack)
    return ExportedView(module, g), values


def _float_like(n: fx.Node) -> bool:
    v = n.meta.get("val")
    return isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex())


def pinned_notes(graph) -> list[str]:
    """Plan notes for operators the planner keeps at fp32 although their kind is a GEMM or attention."""
    notes = []
    functional = [n.name for n in graph.nodes
                  if n.kind in SELECTABLE_KINDS and not n.selectable and "@" not in n.name]
    if functional:
        notes.append(
            f"{len(functional)} functional GEMM/embedding call(s) kept at fp32 ({', '.join(functional[:3])}"
            f"{' ...' if len(functional) > 3 else ''}): the model was captured with torch.export, so a call "
            "outside a plain nn.Linear/nn.Embedding (torch.matmul, or a subclass with its own forward) cannot be "
            "rewritten into a swappable module; route it through one (e.g. qsync_opt.models.layers.MatMul) to plan it")
    sdpa = [n.name for n in graph.nodes if n.kind == "sdpa"]
    if sdpa:
        notes.append(
            f"{len(sdpa)} attention call(s) (F.scaled_dot_product_attention) run at fp32: the runtime returns fp32 "
            "from every quantized operator (boundary fp32) and has no reduced-precision attention, so they are "
            "priced at fp32 as they run")
    return notes
