"""The quantized replacement of transformers' `Conv1D` (GPT-2's linear layer), made when first needed.

`Conv1D` computes y = x @ W + b with W stored (in, out), i.e. nn.Linear with the weight
transposed. `QConv1D` runs the same `QuantizedGemm` as QLinear on the transposed view W.T
(a view of the very same Parameter, so the gradient lands on it and per-channel scales are per
output feature; int and fp8 quantize a contiguous copy, the layout QLinear's kernels get). The class is built against whatever `Conv1D` the loaded transformers
defines, so nothing here imports transformers.
"""

from __future__ import annotations

import functools

import torch

from qsync_opt.runtime.qfunctions import LinearOp, QuantizedGemm

_LINEAR = LinearOp()


@functools.cache
def quantized_conv1d_class(conv1d: type, quantized_module: type) -> type:
    """A QConv1D class: `quantized_module` (qmodules.QuantizedModule, passed in: it imports this module) over `conv1d`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.t()  # (out, in), a view: float paths multiply it as it lies (BLAS takes transposes)
        if self.recipe.path not in ("fp32", "tf32", "float"):
            w = w.contiguous()  # int/fp8 codes in the (out, in) row-major layout the GEMM kernels get from QLinear
        return QuantizedGemm.apply(x, w, self.bias, _LINEAR, self.recipe)

    return type("QConv1D", (quantized_module, conv1d), {"forward": forward, "__module__": __name__,
                                                      "__doc__": "transformers Conv1D at a planned precision."})
