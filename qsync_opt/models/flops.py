"""What an operator is (its kind) and what it costs: forward/backward FLOPs, bytes saved for backward.

The planner only needs relative cost and memory, so the rules are analytic and simple:

- multiply-add = 2 FLOPs. conv: 2·numel(out)·(Cin/groups)·kh·kw (+numel(out) for the bias);
  linear: 2·numel(out)·in_features (+bias); matmul/bmm: 2·numel(out)·K (= 2·M·N·K·batch).
- GEMM-like backward = 2x forward (input grad + weight grad). The first op reading the model
  input does not need its input grad; we keep 2x everywhere for simplicity.
- embedding: forward = numel(out) (a gather); backward = numel(out) (scatter-add into the weight).
- elementwise: numel(out) forward, 1x backward (mul/div: 2x, one grad per input).
- norms and softmax: about 5·numel(out) forward, 2x backward.
- pooling: numel(out)·window (window = kernel area; adaptive/global: numel(in)); a windowed
  pool keeps its input for backward, an adaptive one nothing.
- fused attention (F.scaled_dot_product_attention, not selectable): 4·numel(q)·S, 2x back.
- opaque leaf modules: 2·params·rows (rows = numel(first input) / its last dim), or
  numel(out) when parameter-free; backward 2x.

Saved bytes are FP32 (4 bytes per element) except integer indices (embedding: int64, 8 bytes)
and boolean dropout masks (1 byte).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from qsync_opt.models.graph import SELECTABLE_KINDS
from qsync_opt.models.hf_types import is_hf_conv1d
from qsync_opt.models.layers import FunctionalConv2d, FunctionalLinear, MatMul

#: Kind of a call_module node, by module type; the first isinstance match wins.
MODULE_KINDS: tuple[tuple[type, str], ...] = (
    (MatMul, "matmul"),
    (FunctionalLinear, "linear"),
    (FunctionalConv2d, "conv2d"),
    (nn.Conv1d, "conv1d"),
    (nn.Conv2d, "conv2d"),
    (nn.Linear, "linear"),
    (nn.Embedding, "embedding"),
    (nn.modules.batchnorm._BatchNorm, "batch_norm"),
    (nn.LayerNorm, "layer_norm"),
    (nn.GroupNorm, "group_norm"),
    (nn.ReLU, "relu"),
    (nn.ReLU6, "relu"),
    (nn.GELU, "gelu"),
    (nn.SiLU, "silu"),
    (nn.Tanh, "tanh"),
    (nn.Sigmoid, "sigmoid"),
    (nn.LeakyReLU, "leaky_relu"),
    (nn.Softmax, "softmax"),
    (nn.LogSoftmax, "softmax"),
    (nn.modules.dropout._DropoutNd, "dropout"),
    (nn.modules.pooling._MaxPoolNd, "pool"),
    (nn.modules.pooling._AvgPoolNd, "pool"),
    (nn.modules.pooling._AdaptiveAvgPoolNd, "pool"),
    (nn.modules.pooling._AdaptiveMaxPoolNd, "pool"),
)

#: Module types that only reshape or pass through: dropped from the graph (edges pass through).
VIEW_MODULES: tuple[type, ...] = (nn.Identity, nn.Flatten, nn.Unflatten)

#: call_function / call_method names that move no data worth costing (views, shape queries,
#: dtype/device moves, tensor creation). Dropped; data-flow edges pass through them.
DROPPED_NAMES = frozenset(
    """getitem getattr size dim numel view view_as reshape reshape_as permute transpose t
    contiguous flatten unflatten squeeze unsqueeze expand expand_as split chunk unbind narrow
    select type type_as to float half bfloat16 double long int bool detach clone movedim
    arange zeros ones full empty zeros_like ones_like full_like empty_like tensor as_tensor""".split()
)
#: The same for ATen ops of a torch.export capture only (so fx graphs of today's models do not change).
ATEN_DROPPED_NAMES = frozenset(
    """to_copy alias slice unsafe_view lift_fresh_copy scalar_tensor new_ones new_zeros new_empty
    assert_tensor_metadata sym_size as_strided""".split()
)


def is_dropped(target) -> bool:
    """A call that moves no data worth costing: DROPPED_NAMES, and ATEN_DROPPED_NAMES for ATen ops."""
    name = function_name(target)
    return name in DROPPED_NAMES or (
        isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) and name in ATEN_DROPPED_NAMES)

#: Function/method name -> kind, where the bare name is not already the kind we want.
FUNCTION_KINDS: dict[str, str] = {
    "iadd": "add", "radd": "add", "sub": "sub", "isub": "sub", "rsub": "sub",
    "imul": "mul", "truediv": "div", "itruediv": "div", "floordiv": "div",
    "matmul": "matmul", "bmm": "bmm", "linear": "linear", "conv1d": "conv1d", "conv2d": "conv2d",
    "embedding": "embedding", "log_softmax": "softmax", "batch_norm": "batch_norm",
    "max_pool1d": "pool", "max_pool2d": "pool", "avg_pool1d": "pool", "avg_pool2d": "pool",
    "adaptive_avg_pool1d": "pool", "adaptive_avg_pool2d": "pool", "adaptive_max_pool2d": "pool",
    "scaled_dot_product_attention": "sdpa",
    "softmax": "softmax", "native_layer_norm": "layer_norm", "native_batch_norm": "batch_norm",  # ATen names
}

GEMM_KINDS = frozenset({"conv1d", "conv2d", "linear", "matmul", "bmm"})
NORM_KINDS = frozenset({"batch_norm", "layer_norm", "group_norm", "softmax"})
#: Ops that keep their output for backward (the rest keep their input, if anything).
SAVES_OUTPUT = frozenset({"relu", "softmax", "tanh", "sigmoid", "exp"})
SAVES_NOTHING = frozenset({"add", "sub", "cat", "masked_fill", "neg", "sum", "mean"})


def function_name(target) -> str:
    """Short, stable name of a call_function / call_method target, in-place suffix removed."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):  # torch.export's ATen ops
        name = target._opname if isinstance(target, torch._ops.OpOverload) else target.__name__.split(".")[-1]
        name = name.lstrip("_") if name.startswith("_") and not name.startswith("__") else name
    else:
        name = target if isinstance(target, str) else getattr(target, "__name__", type(target).__name__)
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
    return name.rstrip("_") or name


def function_kind(target) -> str:
    name = function_name(target)
    return FUNCTION_KINDS.get(name, name)


def module_kind(module: nn.Module) -> str:
    for cls, kind in MODULE_KINDS:
        if isinstance(module, cls):
            return kind
    if is_hf_conv1d(module):  # transformers' Conv1D: a linear layer with its weight stored (in, out)
        return "linear"
    return "leaf"


def is_selectable(kind: str) -> bool:
    return kind in SELECTABLE_KINDS


@dataclass(frozen=True)
class OpCost:
    fwd_flops: int
    bwd_flops: int
    saved_bytes: int


def numel(shape) -> int:
    """Elements of a tensor of `shape` (1 for a scalar)."""
    return math.prod(shape) if shape else 1


def op_cost(
    kind: str,
    input_shapes: tuple[tuple[int, ...], ...],
    output_shape: tuple[int, ...],
    *,
    weight_shape: tuple[int, ...] | None = None,
    has_bias: bool = False,
    param_count: int = 0,
    window: int | None = None,
) -> OpCost:
    """Analytic cost of one op (rules in the module docstring). `window` = pooling kernel area."""
    out = numel(output_shape)
    ins = [numel(s) for s in input_shapes]
    first_in = ins[0] if ins else 0
    bias = out if has_bias else 0

    if kind in ("conv1d", "conv2d") and weight_shape is not None:
        fwd = 2 * out * numel(weight_shape[1:]) + bias
        return OpCost(fwd, 2 * fwd, 4 * first_in)
    if kind == "linear" and weight_shape is not None:
        fwd = 2 * out * weight_shape[-1] + bias
        return OpCost(fwd, 2 * fwd, 4 * first_in)
    if kind in ("matmul", "bmm") and input_shapes:
        a = input_shapes[0]
        k = a[-1] if a else 1
        fwd = 2 * out * k
        return OpCost(fwd, 2 * fwd, 4 * sum(ins))
    if kind == "embedding":
        return OpCost(out, out, 8 * first_in)
    if kind in NORM_KINDS:
        saved = 4 * (out if kind == "softmax" else first_in)
        return OpCost(5 * out, 10 * out, saved)
    if kind == "pool":
        fwd = out * window if window else max(first_in, out)
        return OpCost(fwd, fwd, 4 * first_in if window else 0)
    if kind == "dropout":
        return OpCost(out, out, out)  # bool mask
    if kind == "sdpa" and input_shapes:  # fused attention: QK^T and PV products
        q = input_shapes[0]
        k = input_shapes[1] if len(input_shapes) > 1 else q
        fwd = 4 * numel(q) * (k[-2] if len(k) > 1 else 1)
        return OpCost(fwd, 2 * fwd, 4 * (sum(ins[:3]) + out))
    if kind == "leaf":
        rows = first_in // input_shapes[0][-1] if input_shapes and input_shapes[0] else 1
        fwd = 2 * param_count * rows if param_count else out
        return OpCost(fwd, 2 * fwd, 4 * first_in)
    # elementwise and everything else: one FLOP per output element
    if kind in ("mul", "div"):
        keeps = len(ins) > 1 or param_count > 0  # x * scalar keeps nothing; x * y keeps both
        return OpCost(out, 2 * out, 4 * sum(ins) if keeps else 0)
    if kind in SAVES_NOTHING:
        return OpCost(out, out, 0)
    saved = 4 * (out if kind in SAVES_OUTPUT else first_in)
    return OpCost(out, out, saved)


def pool_window(module_or_kwargs) -> int | None:
    """Kernel area of a max/avg pool module (None for adaptive pools)."""
    k = getattr(module_or_kwargs, "kernel_size", None)
    if k is None or isinstance(module_or_kwargs, (nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool1d)):
        return None
    return numel(k) if isinstance(k, (tuple, list)) else int(k) ** _pool_dims(module_or_kwargs)


def _pool_dims(module) -> int:
    if isinstance(module, (nn.MaxPool1d, nn.AvgPool1d)):
        return 1
    if isinstance(module, (nn.MaxPool3d, nn.AvgPool3d)):
        return 3
    return 2


__all__ = [
    "MODULE_KINDS", "VIEW_MODULES", "DROPPED_NAMES", "GEMM_KINDS", "OpCost",
    "function_kind", "function_name", "module_kind", "is_selectable", "op_cost", "pool_window",
]
