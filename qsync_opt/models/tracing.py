"""torch.fx tracing of an nn.Module into the planner's OpGraph.

Three passes: symbolic tracing with a Tracer that treats standard and user-named modules as
leaves and remembers which module broke tracing; a shape-recording Interpreter run on the
example inputs (any device, `meta` included, so big models trace without compute); and a
walk over the fx graph that keeps costed operators, drops view-like nodes while passing
their data-flow through, and derives edges, selectable edges and depths (models.trace_walk).

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

import torch
import torch.fx as fx
from torch import nn

from qsync_opt.errors import ModelError, SpecError
from qsync_opt.models.capture_lock import capturing
from qsync_opt.models.graph import OpGraph
from qsync_opt.models.layers import FUNCTIONAL_LAYERS, MatMul
from qsync_opt.models.trace_walk import MAX_MERGES, build_op_graph, enclosing_module

__all__ = ["MAX_MERGES", "TRACE_BATCH", "op_names", "record_shapes", "symbolic_trace", "trace"]

_CULPRIT = "_qsync_trace_culprit"



TRACE_BATCH = 1
"""Samples per trace: shapes are per-sample, so one sample is enough to capture the graph."""

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
            where = enclosing_module(n)
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
    on_export: "Callable[[], object] | None" = None,
) -> OpGraph:
    """Trace `module` on `example_inputs` (a tensor or a tuple of forward arguments) to an OpGraph.

    `on_export()` is called when fx cannot follow the model and torch.export (seconds of Python)
    takes over: a caller can start work that overlaps it (training/pipeline.py's weight replay)."""
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    if first is None or first.dim() == 0:
        raise SpecError(
            f"example_inputs: need at least one tensor with a leading batch dimension, got "
            f"{[type(x).__name__ for x in inputs]}; pass e.g. (torch.randn(B, 3, 224, 224),)."
        )
    try:
        gm = symbolic_trace(module, leaf_modules, model_name)
    except ModelError as fx_error:  # fx cannot follow it (transformers models): capture with torch.export
        if on_export is not None:
            on_export()
        return _trace_exported(module, inputs, leaf_modules, model_name, int(first.shape[0]), fx_error)
    values = record_shapes(gm, inputs)
    return build_op_graph(gm, values, model_name, int(first.shape[0]))


def _trace_exported(module, inputs, leaf_modules, model_name, batch_size, fx_error) -> OpGraph:
    """The OpGraph from torch.export (models/export_trace.py); if that fails too, both reasons in one error."""
    # import cost: the torch.export path is loaded only for models fx cannot trace
    from qsync_opt.models.export_trace import OutputNotATensor, export_graph

    try:
        with capturing():  # torch.export's process-wide state (dynamo, fake modes) takes the same lock
            view, values = export_graph(module, inputs, _leaf_matcher(module, leaf_modules), model_name)
    except OutputNotATensor:
        raise
    except ModelError as e:
        raise ModelError(f"{fx_error} torch.export could not capture it either: {e}") from e
    from dataclasses import replace

    return replace(build_op_graph(view, values, model_name, batch_size, pin_functional=True), captured_by="export")


def op_names(gm: fx.GraphModule, inputs: Sequence) -> dict[str, str]:
    """fx node name -> OpNode name for every kept op of `gm`: the names a plan uses, computed as trace does."""
    names: dict[str, str] = {}
    build_op_graph(gm, record_shapes(gm, tuple(inputs)), "names", 1, names_out=names)
    return names
