"""Drop-in quantized modules for nn.Linear, nn.Conv1d, nn.Conv2d, MatMul and nn.Embedding.

Each subclasses the module it replaces and keeps the very same Parameter objects under the
same names, so state dicts load both ways, optimizers built before the swap keep working,
and `isinstance(m, nn.Linear)` stays true. Only `forward` changes: it routes through
`QuantizedGemm` (or a straight-through lookup for embeddings) with the module's `recipe`.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from qsync_opt.models.layers import FunctionalConv2d, FunctionalLinear, MatMul
from qsync_opt.models.hf_types import is_hf_conv1d
from qsync_opt.runtime.casts import Quantized, StraightThrough, cast, quantize
from qsync_opt.runtime.qfunctions import ConvOp, LinearOp, MatMulOp, QuantizedGemm
from qsync_opt.runtime.qmodules_hf import quantized_conv1d_class
from qsync_opt.runtime.recipe import Recipe

_LINEAR, _MATMUL = LinearOp(), MatMulOp()


def _reclass(module: nn.Module, cls: type) -> nn.Module:
    """A new `cls` instance sharing `module`'s parameters, buffers, children and hooks."""
    new = cls.__new__(cls)
    state = dict(module.__dict__)
    for key, value in state.items():
        if key.startswith("_") and isinstance(value, dict):
            state[key] = OrderedDict(value) if isinstance(value, OrderedDict) else dict(value)
    new.__dict__.update(state)
    return new


class QuantizedModule:
    """Mixin: a `recipe`, the original class to restore, and the two conversions."""

    recipe: Recipe
    _qsync_original: type

    @classmethod
    def from_float(cls, module: nn.Module, recipe: Recipe) -> nn.Module:
        new = _reclass(module, cls)
        new.recipe = recipe
        new._qsync_original = type(module)
        new._qsync_prepare()
        return new

    def to_float(self) -> nn.Module:
        plain = _reclass(self, self._qsync_original)
        for key in ("recipe", "_qsync_original", "_qop", "_prepad"):
            plain.__dict__.pop(key, None)
        return plain

    def _qsync_prepare(self):
        pass

    @property
    def precision(self) -> str:
        return self.recipe.precision

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, precision={self.recipe.describe()}".lstrip(", ")


class QLinear(QuantizedModule, nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return QuantizedGemm.apply(x, self.weight, self.bias, _LINEAR, self.recipe)


class _QConvNd(QuantizedModule):
    """Shared forward of QConv1d/QConv2d; non-zero padding modes and 'same' pad explicitly first."""

    _ndim: int

    def _qsync_prepare(self):
        self._prepad = self.padding_mode != "zeros" or isinstance(self.padding, str)
        padding = (0,) * self._ndim if self._prepad else self.padding
        self._qop = ConvOp(self._ndim, self.stride, padding, self.dilation, self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        unbatched = x.dim() == self._ndim + 1
        if unbatched:
            x = x.unsqueeze(0)
        if self._prepad:
            mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=mode)
        y = QuantizedGemm.apply(x, self.weight, self.bias, self._qop, self.recipe, self.kernel_size)
        return y.squeeze(0) if unbatched else y


class QConv1d(_QConvNd, nn.Conv1d):
    _ndim = 1


class QConv2d(_QConvNd, nn.Conv2d):
    _ndim = 2


class QMatMul(QuantizedModule, MatMul):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        vec_a, vec_b = a.dim() == 1, b.dim() == 1
        a = a.unsqueeze(0) if vec_a else a
        b = b.unsqueeze(-1) if vec_b else b
        y = QuantizedGemm.apply(a, b, None, _MATMUL, self.recipe)
        y = y.squeeze(-1) if vec_b else y
        return y.squeeze(-2) if vec_a else y


class QFunctionalLinear(QuantizedModule, FunctionalLinear):
    """A rewritten `F.linear` call (models.rewrite): the weight is the user's parameter, passed in."""

    def forward(self, x, weight, bias=None):
        return QuantizedGemm.apply(x, weight, bias, _LINEAR, self.recipe)


class QFunctionalConv2d(QuantizedModule, FunctionalConv2d):
    """A rewritten `F.conv2d` call; 'same'/'valid' padding resolved from the weight's kernel size."""

    def forward(self, x, weight, bias=None):
        k = tuple(weight.shape[2:])
        pad = self.padding
        if pad == "valid":
            pad = (0, 0)
        elif pad == "same":
            total = [d * (kk - 1) for d, kk in zip(self.dilation, k)]
            if any(t % 2 for t in total):
                x = F.pad(x, (total[1] // 2, total[1] - total[1] // 2, total[0] // 2, total[0] - total[0] // 2))
                pad = (0, 0)
            else:
                pad = tuple(t // 2 for t in total)
        op = ConvOp(2, self.stride, pad, self.dilation, self.groups)
        return QuantizedGemm.apply(x, weight, bias, op, self.recipe, k)


class QEmbedding(QuantizedModule, nn.Embedding):
    """Lookup of rows rounded to the precision; the gradient scatters in fp32 onto the table.

    bf16/fp16 round the looked-up rows; fp8 and int quantize the whole table (int weights per
    tensor or, with per_channel, one scale per row) and dequantise the rows that are read.
    """

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(idx, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)
        r = self.recipe
        if r.path in ("fp32", "tf32"):
            return rows
        if r.path == "float":
            approx = cast(cast(rows.detach(), r.compute_dtype), torch.float32)
        else:
            per_row = r.path == "int" and r.granularity == "per_channel"
            q = quantize(self.weight, r, per_channel=per_row)
            codes = q.codes[idx]
            if per_row:
                approx = codes.to(torch.float32) * q.scale.reshape(-1)[idx].unsqueeze(-1)
            else:
                approx = Quantized(codes, q.scale, None, q.fp8, q.impl).dequantize()
        return StraightThrough.apply(rows, approx)


class _SwapTable(dict):
    """A dict that also answers for transformers' Conv1D (runtime/qmodules_hf.py), without importing transformers."""

    def _lazy(self, key) -> None:
        if isinstance(key, type) and not dict.__contains__(self, key) and is_hf_conv1d(key):
            self[key] = quantized_conv1d_class(key, QuantizedModule)

    def __contains__(self, key) -> bool:
        self._lazy(key)
        return dict.__contains__(self, key)

    def __getitem__(self, key):
        self._lazy(key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        self._lazy(key)
        return dict.get(self, key, default)


#: Plain module type -> its quantized replacement. Exact types only: a subclass may override forward.
SWAPPABLE: dict[type, type] = _SwapTable({
    nn.Linear: QLinear,
    nn.Conv1d: QConv1d,
    nn.Conv2d: QConv2d,
    MatMul: QMatMul,
    nn.Embedding: QEmbedding,
    FunctionalLinear: QFunctionalLinear,  # functional calls rewritten into modules (models.rewrite)
    FunctionalConv2d: QFunctionalConv2d,
})
