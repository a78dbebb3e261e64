"""Small modules that make functional operators addressable by FQN.

A plan is keyed by module FQN, so an attention score product written as `q @ k.T` has no
stable name to key on and no module to swap. Models route such products through `MatMul`:
the tracer sees one selectable `matmul` op with the module's FQN, and the runtime swaps it
like any other layer.
"""

from __future__ import annotations

import torch
from torch import nn


class MatMul(nn.Module):
    """`torch.matmul(a, b)` as a module (batched when the inputs are)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


class FunctionalLinear(nn.Module):
    """`F.linear(x, weight, bias)` as a module whose weight arrives as an argument.

    What `models.rewrite` puts in place of a functional call in a user's model: the weight
    stays the user's own Parameter under its own name, and the call gets an FQN a plan can name.
    """

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.nn.functional.linear(x, weight, bias)


class FunctionalConv2d(nn.Module):
    """`F.conv2d(x, weight, bias, stride, padding, dilation, groups)` with the geometry fixed at rewrite time."""

    def __init__(self, stride=1, padding=0, dilation=1, groups: int = 1):
        super().__init__()
        pair = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v, v)  # noqa: E731
        self.stride, self.dilation, self.groups = pair(stride), pair(dilation), groups
        self.padding = padding if isinstance(padding, str) else pair(padding)

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, groups={self.groups}"


#: Modules that stand for a functional GEMM; the tracer keeps them whole and reads the weight from their arguments.
FUNCTIONAL_LAYERS = (FunctionalLinear, FunctionalConv2d)
