"""The quantized replacement of transformers' `Conv1D` (GPT-2's linear layer), made when first needed.

`Conv1D` computes y = x @ W + b with W stored (in, out), i.e. nn.Linear with the weight
transposed. `QConv1D` runs the same `QuantizedGemm` as QLinear on the transposed view W.T
(a view of the very same Parameter, so the gradient lands on it and per-channel scales are per
output feature). The class is built against whatever `Conv1D` the loaded transformers
defines, so nothing here imports transformers.
"""

from __future__ import annotations

import functools

import torch

from .qfunctions import LinearOp, QuantizedGemm

_LINEAR = LinearOp()


@functools.cache
def quantized_conv1d_class(conv1d: type) -> type:
    from .qmodules import QuantizedModule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return QuantizedGemm.apply(x, self.weight.t(), self.bias, _LINEAR, self.recipe)

    return type("QConv1D", (QuantizedModule, conv1d), {"forward": forward, "__module__": __name__,
                                                      "__doc__": "transformers Conv1D at a planned precision."})
