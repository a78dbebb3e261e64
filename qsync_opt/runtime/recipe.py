"""Recipe: everything a quantized operator needs to know about how to compute.

One frozen value per swapped module, built from a plan entry plus `spec.runtime`, so the
forward and backward of an operator never read global settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qsync_opt.errors import RuntimeSetupError
from qsync_opt.precision import INTEGER, PRECISIONS

#: Formats whose forward runs as a float GEMM in that dtype (backward in the same dtype, as AMP does).
FLOAT_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: Emulated 8-bit floats: storage type of the codes kept for backward.
FP8_DTYPES: dict[str, torch.dtype] = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
#: Integer formats: bits handed to kernels.ops.quantize_symmetric.
INT_BITS: dict[str, int] = {"int8": 8, "int4": 4}
BACKWARD_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: backward='fp8': fp8 linears run both backward GEMMs in fp8; every other quantized operator runs its backward here.
FP8_BACKWARD_FALLBACK = "bf16"

_CHOICES = {
    "backward": (*BACKWARD_DTYPES, "fp8"),
    "granularity": ("per_tensor", "per_channel"),
    "rounding": ("nearest", "stochastic"),
    "kernels": ("auto", "templated", "torch"),
}


@dataclass(frozen=True)
class Recipe:
    """How one operator runs.

    precision:   the plan's format for the forward GEMM.
    backward:    dtype of grad_input / grad_weight GEMMs for fp8 and integer formats
                 (float formats run their backward in their own dtype). 'fp8': fp8 linears quantize the
                 output gradient to e5m2 and multiply it with their saved fp8 codes (`fp8_backward`);
                 other fp8 and integer operators then run their backward in FP8_BACKWARD_FALLBACK.
    granularity: integer weight scales, one per tensor or one per output channel.
    rounding:    'nearest' or 'stochastic' for integer quantization (fp8 is always nearest).
    kernels:     implementation handed to kernels.ops ('auto', 'templated', 'torch').
    """

    precision: str
    backward: str = "bf16"
    granularity: str = "per_tensor"
    rounding: str = "nearest"
    kernels: str = "auto"

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise RuntimeSetupError(
                f"precision {self.precision!r} is not a known format; use one of {', '.join(PRECISIONS)}"
            )
        for field, allowed in _CHOICES.items():
            value = getattr(self, field)
            if value not in allowed:
                raise RuntimeSetupError(f"{field}={value!r} is not accepted; use one of {', '.join(allowed)}")

    @property
    def path(self) -> str:
        """'fp32', 'tf32', 'float' (bf16/fp16), 'fp8' or 'int': which forward implementation runs."""
        if self.precision in ("fp32", "tf32"):
            return self.precision
        if self.precision in FLOAT_DTYPES:
            return "float"
        if self.precision in FP8_DTYPES:
            return "fp8"
        assert self.precision in INTEGER
        return "int"

    @property
    def compute_dtype(self) -> torch.dtype:
        """Dtype of the tensors entering the forward GEMM (fp8 and int emulate through fp32/int8)."""
        return FLOAT_DTYPES.get(self.precision, torch.float32)

    @property
    def backward_dtype(self) -> torch.dtype:
        if self.path == "float":
            return FLOAT_DTYPES[self.precision]
        if self.path in ("fp32", "tf32"):
            return torch.float32
        return BACKWARD_DTYPES[FP8_BACKWARD_FALLBACK if self.backward == "fp8" else self.backward]

    @property
    def fp8_backward(self) -> bool:
        """Whether an fp8 operator's backward GEMMs run in fp8 (where the operator has that path: linears)."""
        return self.backward == "fp8" and self.path == "fp8"

    @property
    def stochastic(self) -> bool:
        return self.rounding == "stochastic"

    def describe(self) -> str:
        extra = ""
        if self.path in ("fp8", "int"):
            extra = f", backward={self.backward}"
        if self.path == "int":
            extra += f", weights={self.granularity}, rounding={self.rounding}"
        return f"{self.precision}{extra}"
