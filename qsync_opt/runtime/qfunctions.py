"""The autograd Function behind every quantized GEMM-shaped operator (linear, conv, matmul).

One Function, three operator shapes. Forward by precision:
  tf32        fp32 tensors, TF32 tensor-core math scoped to the op (CUDA); plain fp32 on CPU.
  bf16, fp16  input and weight cast to the format (timed `qsync::cast` steps), the op runs in
              that dtype, the output is cast back to fp32. Backward runs in the same dtype.
  fp8_*       input and weight quantized to fp8 codes (kernels.ops.quantize_fp8); where
              kernels/dispatch.py names fp8 tensor cores (CUDA sm_89+) the GEMM runs on the codes
              (kernels.ops.fp8_linear), elsewhere an fp32 GEMM on the exact fp8 values.
  int8, int4  QSync's scheme: symmetric scales (per-tensor activations; per-tensor or
              per-output-channel weights), int8 x int8 -> int32 GEMM with the dequantising
              epilogue fused (kernels.ops.int8_linear); int4 codes (±7) go to kernels.ops.int4_linear,
              the s4 tensor-core kernel where dispatch names it, else the same int8 GEMM.
Every operator returns fp32 (BOUNDARY): one rule, and the cast back is a visible step of its own.

Backward of fp8/int: the saved activation and weight are the codes and scales (8 bits per
element); backward dequantises them to `recipe.backward` (bf16/fp16/fp32) and computes
grad_input and grad_weight there; grad_weight is returned in fp32 and accumulated onto the
fp32 master weight by autograd. The bias gradient is always summed in fp32.
Under `recipe.backward == 'fp8'` an fp8 linear runs both backward GEMMs in fp8 instead (torchao's float8
training recipe, tensorwise): the output gradient is quantized to e5m2 with a per-tensor scale and multiplied with
the saved codes as they are (kernels.ops.fp8_linear on transposed copies; kernels.dispatch.fp8_backward_impl
names the GEMM), nothing dequantised; its forward GEMM accumulates fast as torchao's does
(dispatch.fp8_training_forward_impl); fp8 convolutions and matmuls run their backward in the fallback 16-bit format.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qsync_opt.kernels import ops as kops
from qsync_opt.kernels.dispatch import GRAD_FP8, SCALED_MM_FAST, Target, fp8_training_forward_impl, gemm_impl
from qsync_opt.kernels.reference import qmax_of
from qsync_opt.runtime.casts import Quantized, cast, quantize, scope, tf32_enabled
from qsync_opt.runtime.recipe import INT_BITS, Recipe

#: The runtime.boundary this runtime implements: every quantized operator returns fp32.
BOUNDARY = "fp32"


def _mm(a, b):
    """torch.matmul(a, b); fp16 on CPU is laid out as A row-major, B transposed-row-major, the one
    layout torch's CPU backend runs fast in fp16 (others are several times slower: docs/devices.md)."""
    if a.dtype == torch.float16 and a.device.type == "cpu":
        a, b = a.contiguous(), b.transpose(-1, -2).contiguous().transpose(-1, -2)
    return torch.matmul(a, b)


class LinearOp:
    """y = x @ w.T + b over the last dimension of x; w is (out, in)."""

    per_channel = True

    def weight_matrix(self, w):
        return w

    def float_forward(self, x, w, bias):
        return F.linear(x, w, bias)

    def int_forward(self, xq: Quantized, wq: Quantized, bias, gemm):
        k = xq.codes.shape[-1]
        y = gemm(xq.codes.reshape(-1, k), xq.scale, wq.codes, wq.scale, bias)
        return y.reshape(*xq.codes.shape[:-1], wq.codes.shape[0])

    def backward(self, gy, x, w, need_x, need_w):
        gx = _mm(gy, w) if need_x else None
        gw = _mm(gy.reshape(-1, gy.shape[-1]).t(), x.reshape(-1, x.shape[-1])) if need_w else None
        return gx, gw

    def bias_grad(self, gy):
        return gy.reshape(-1, gy.shape[-1]).sum(0)

    def fp8_backward(self, gy, x: Quantized, w: Quantized, need_x, need_w, kernels: str):
        """(grad_input, grad_weight) in fp32 from the e5m2 output gradient and the saved fp8 codes: gx = gy @ w on
        (M, out) x (out, in), gw = gy.T @ x on (out, M) x (M, in), each as fp8_linear's A @ B.T."""
        g2 = gy.reshape(-1, gy.shape[-1])
        with scope(f"quantize[grad->fp8_{GRAD_FP8}]"):
            gq, gs = kops.quantize_fp8(g2.float(), GRAD_FP8, impl=kernels)
        gx = gw = None
        if need_x:
            gx = kops.fp8_linear(gq, gs, w.codes.t().contiguous(), w.scale, None, impl=kernels)
            gx = gx.reshape(*gy.shape[:-1], w.codes.shape[1])
        if need_w:
            x2 = x.codes.reshape(-1, x.codes.shape[-1])
            gw = kops.fp8_linear(gq.t().contiguous(), gs, x2.t().contiguous(), x.scale, None, impl=kernels)
        return gx, gw


class ConvOp:
    """N-d convolution (N = 1 or 2) with zero padding; other padding modes are applied before.

    The quantized forward of int8/int4 codes on a CPU runs a oneDNN convolution whose integer sums are exact there
    (kernels.ops.int8_conv2d: its int8 convolution with VNNI, else its fp32 one on the codes' values while no partial
    sum can pass 2**24; not under kernels='templated'); otherwise, and for fp8, im2col (unfold of the codes, exact
    as fp32 values) followed by the GEMM, one per group. All are exact integer arithmetic with the same epilogue,
    so they give the same output bit for bit.
    """

    per_channel = True

    def __init__(self, ndim: int, stride, padding, dilation, groups: int):
        self.ndim, self.stride, self.padding, self.dilation, self.groups = ndim, tuple(stride), tuple(padding), tuple(dilation), groups

    def weight_matrix(self, w):
        return w.reshape(w.shape[0], -1)

    def float_forward(self, x, w, bias):
        conv = F.conv1d if self.ndim == 1 else F.conv2d
        return conv(x, w, bias, self.stride, self.padding, self.dilation, self.groups)

    def int_forward(self, xq: Quantized, wq: Quantized, bias, gemm, kernel_size, impl: str = "auto", qmax: int = 127):
        codes = xq.codes
        k, s, p, d = tuple(kernel_size), self.stride, self.padding, self.dilation
        if self.ndim == 1:
            codes = codes.unsqueeze(2)
            k, s, p, d = (1, *k), (1, *s), (0, *p), (1, *d)
        with scope("onednn_conv"):  # int8/int4 codes on a CPU, exact integer sums; bit-equal to the path below
            y = kops.int8_conv2d(codes, xq.scale, wq.codes.reshape(wq.codes.shape[0], -1, *k), wq.scale, bias, s, p, d,
                                 self.groups, qmax=qmax, impl=impl)
        if y is not None:
            return y.squeeze(2) if self.ndim == 1 else y
        n, c, h, wd = codes.shape
        with scope("im2col"):
            cols = F.unfold(codes.to(torch.float32), k, d, p, s)  # (n, c*kh*kw, L), small integers: exact
            ho = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
            wo = (wd + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
            cols = cols.transpose(1, 2).reshape(n * ho * wo, -1).to(xq.codes.dtype)
        out_ch, per_group = wq.codes.shape[0] // self.groups, cols.shape[1] // self.groups
        parts = []
        for g in range(self.groups):
            sw = wq.scale if wq.scale.numel() == 1 else wq.scale[g * out_ch:(g + 1) * out_ch]
            b = None if bias is None else bias[g * out_ch:(g + 1) * out_ch]
            parts.append(gemm(cols[:, g * per_group:(g + 1) * per_group].contiguous(), xq.scale,
                              wq.codes[g * out_ch:(g + 1) * out_ch], sw, b))
        y = parts[0] if self.groups == 1 else torch.cat(parts, dim=1)
        y = y.reshape(n, ho, wo, -1).permute(0, 3, 1, 2).contiguous()
        return y.squeeze(2) if self.ndim == 1 else y

    def backward(self, gy, x, w, need_x, need_w):
        gx, gw, _ = torch.ops.aten.convolution_backward(
            gy, x, w, None, list(self.stride), list(self.padding), list(self.dilation),
            False, [0] * self.ndim, self.groups, [need_x, need_w, False])
        return gx, gw

    def bias_grad(self, gy):
        return gy.sum(dim=[0, *range(2, gy.dim())])


class MatMulOp:
    """torch.matmul(a, b) for a (..., M, K) and b (..., K, N), batch dimensions broadcast.

    Both operands are activations: per-tensor scales for both. The integer forward runs one
    int8 GEMM per broadcast batch element.
    """

    per_channel = False

    def weight_matrix(self, b):
        return b

    def float_forward(self, a, b, bias):
        return _mm(a, b)

    def int_forward(self, aq: Quantized, bq: Quantized, bias, gemm):
        a, b = aq.codes, bq.codes
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        a3 = a.expand(*batch, m, k).reshape(-1, m, k)
        bt = b.transpose(-1, -2).expand(*batch, n, k).reshape(-1, n, k)
        outs = [gemm(a3[i].contiguous(), aq.scale, bt[i].contiguous(), bq.scale, None) for i in range(a3.shape[0])]
        return torch.stack(outs).reshape(*batch, m, n)

    def backward(self, gy, a, b, need_a, need_b):
        ga = _mm(gy, b.transpose(-1, -2)).sum_to_size(a.shape) if need_a else None
        gb = _mm(a.transpose(-1, -2), gy).sum_to_size(b.shape) if need_b else None
        return ga, gb

    def bias_grad(self, gy):  # pragma: no cover - matmul has no bias
        raise NotImplementedError


def quantized_gemm(recipe: Recipe, x: torch.Tensor, fast_accum: bool = False):
    """The 2-d GEMM (codes, scale, codes, scale, bias) -> fp32 for an int/fp8 recipe on x's device,
    or None where kernels/dispatch.py says the format is emulated by an fp32 GEMM (fp8 without fp8 units).
    `fast_accum`: an fp8 GEMM on torch._scaled_mm accumulates fast (dispatch.fp8_training_forward_impl)."""
    impl = recipe.kernels
    if recipe.path == "int":
        f = kops.int4_linear if recipe.precision == "int4" else kops.int8_linear
        return lambda a, sa, b, sb, bias: f(a, sa, b, sb, bias, out_dtype=torch.float32, impl=impl)
    if gemm_impl(Target.of_tensor(x), recipe.precision, impl).kind == "emulation":
        return None
    return lambda a, sa, b, sb, bias: kops.fp8_linear(a, sa, b, sb, bias, impl=impl, fast_accum=fast_accum)


class QuantizedGemm(torch.autograd.Function):
    """y = op(x, w) (+ bias) at `recipe.precision`; see the module docstring for each path."""

    @staticmethod
    def forward(ctx, x, w, bias, op, recipe: Recipe, kernel_size=None):
        ctx.op, ctx.recipe = op, recipe
        ctx.x_dtype, ctx.w_dtype, ctx.x_shape, ctx.w_shape = x.dtype, w.dtype, x.shape, w.shape
        ctx.tf32 = recipe.path == "tf32" and x.is_cuda
        if recipe.path in ("fp32", "tf32", "float"):
            dt = recipe.compute_dtype
            xc, wc = cast(x, dt), cast(w, dt)
            with tf32_enabled(ctx.tf32):
                y = op.float_forward(xc, wc, cast(bias, dt))
            ctx.save_for_backward(xc, wc)
            ctx.meta = None
            return cast(y, torch.float32)

        per_channel = op.per_channel and recipe.granularity == "per_channel"
        xq = quantize(x, recipe)
        wq = quantize(op.weight_matrix(w), recipe, per_channel=per_channel)
        b32 = cast(bias, torch.float32)
        fast = recipe.fp8_backward and isinstance(op, LinearOp) and \
            fp8_training_forward_impl(Target.of_tensor(x), recipe.precision, recipe.kernels).op == SCALED_MM_FAST
        gemm = quantized_gemm(recipe, x, fast_accum=fast)  # torchao's float8 recipe, forward and backward
        if gemm is not None:
            with scope(f"gemm[{recipe.precision}]"):
                qmax = qmax_of(INT_BITS.get(recipe.precision, 8))  # fp8 codes never take the integer convolution
                extra = (kernel_size, recipe.kernels, qmax) if isinstance(op, ConvOp) else ()
                y = op.int_forward(xq, wq, b32, gemm, *extra)
        else:  # fp8 emulated: exact fp8 values, fp32 GEMM
            with scope(f"gemm[{recipe.precision}]"):
                y = op.float_forward(xq.dequantize().reshape(x.shape), wq.dequantize().reshape(w.shape), b32)
        ctx.save_for_backward(xq.codes, xq.scale, wq.codes, wq.scale)
        ctx.meta = (xq.axis, wq.axis, xq.fp8)
        return y

    @staticmethod
    def backward(ctx, gy):
        op, recipe = ctx.op, ctx.recipe
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        bd = recipe.backward_dtype
        fp8_grads = recipe.fp8_backward and isinstance(op, LinearOp)
        if ctx.meta is None:
            xb, wb = ctx.saved_tensors
        else:
            xc, xs, wc, ws = ctx.saved_tensors
            x_axis, w_axis, fp8 = ctx.meta
            xq = Quantized(xc, xs, x_axis, fp8, recipe.kernels)
            wq = Quantized(wc, ws, w_axis, fp8, recipe.kernels)
            if not fp8_grads:  # dequantise in fp32, then one rounding to the backward dtype
                xb = cast(xq.dequantize(), bd).reshape(ctx.x_shape)
                wb = cast(wq.dequantize(), bd).reshape(ctx.w_shape)
        gx = gw = gb = None
        if fp8_grads and (need_x or need_w):
            with scope(f"backward[{recipe.precision}@fp8]"):
                gx, gw = op.fp8_backward(gy, xq, wq, need_x, need_w, recipe.kernels)
            gx, gw = cast(gx, ctx.x_dtype), cast(gw, ctx.w_dtype)
        elif need_x or need_w:
            with tf32_enabled(ctx.tf32), scope(f"backward[{recipe.precision}@{str(bd).removeprefix('torch.')}]"):
                gx, gw = op.backward(cast(gy, bd), xb, wb, need_x, need_w)
            gx, gw = cast(gx, ctx.x_dtype), cast(gw, ctx.w_dtype)
        if need_b:
            gb = op.bias_grad(cast(gy, torch.float32))
        return gx, gw, gb, None, None, None
