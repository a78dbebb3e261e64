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
