"""The CUDA half of kernels.ops: which templated module serves a device, and the calls into it.

The runtime's CUDA module is rendered for the device's tiles.yaml arch with fp32 inputs and
outputs and per-channel weight scales (a per-tensor scale is broadcast to every channel, which
gives the same products). One module per fp8 format, built only when that format is used.
Library GEMMs (torch._int_mm, torch._scaled_mm) get their epilogue from reference.epilogue,
so every path applies the scales in the same order.
"""

from __future__ import annotations

import functools
import threading
import warnings

import torch
from torch import Tensor

from qsync_opt.errors import KernelBuildError, SpecError
from qsync_opt.kernels import reference
from qsync_opt.kernels.dispatch import Target, cuda_arch

_LOCK = threading.Lock()
_AUTO_FAILURES: dict = {}  # (arch, fp8 format) -> KernelBuildError seen under impl='auto'


@functools.lru_cache(maxsize=None)
def runtime_spec(sm: int, fp8_format: str = "e4m3"):
    """The CudaSpec the runtime uses on a device of capability `sm`, or None below every tiles arch."""
    from qsync_opt.kernels.spec import CudaSpec  # import cost: the kernel specs, only once a CUDA device asks

    arch = cuda_arch(sm)
    if arch is None:
        return None
    return CudaSpec(arch=arch, in_dtype="fp32", out_dtype="fp32", granularity="channel", fp8_format=fp8_format)


def module(device: torch.device, impl: str, fp8_format: str = "e4m3"):
    """The loaded CUDA module for `device`, or None when the torch path must run (impl='torch',
    no tiles arch for the device, or under 'auto' a build that failed: warned once, not retried)."""
    if impl == "torch":
        return None
    target = Target.of_device(device)
    spec = runtime_spec(target.sm, fp8_format)
    if spec is None:
        if impl == "templated":
            raise SpecError(f"impl='templated': no templated CUDA kernels for {target.label} (tiles.yaml starts at "
                            "sm_75); use impl='auto' or 'torch'")
        return None
    from qsync_opt.kernels.registry import get_cuda_module  # import cost: jinja2 and the kernel build chain

    if impl == "templated":
        return get_cuda_module(spec)
    with _LOCK:
        key = (spec.arch, fp8_format)
        if key in _AUTO_FAILURES:
            return None
        try:
            return get_cuda_module(spec)
        except KernelBuildError as e:
            _AUTO_FAILURES[key] = e
            warnings.warn(f"qsync_opt.kernels: templated CUDA kernels for {spec.arch} unavailable, using torch ops:\n{e}",
                          RuntimeWarning, stacklevel=3)
            return None


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream


def _f32(t: Tensor, device, n: int | None = None) -> Tensor:
    t = t.to(device=device, dtype=torch.float32).reshape(-1)
    return (t.expand(n) if n is not None and t.numel() == 1 else t).contiguous()


def quantize(mod, x: Tensor, scale: Tensor | None, qmax: int, axis: int | None, stochastic: bool, seed: int):
    s = None if scale is None else _f32(scale, x.device)
    return mod.ops.quantize(x.contiguous(), s, qmax, axis, stochastic, seed, _stream(x))


def dequantize(mod, q: Tensor, scale: Tensor, axis: int | None) -> Tensor:
    return mod.ops.dequantize(q.contiguous(), _f32(scale, q.device), axis, _stream(q))


def absmax(mod, x: Tensor, axis: int | None) -> Tensor:
    return mod.ops.absmax(x.contiguous(), axis, _stream(x))


def _operands(xq, sx, wq, sw, bias):
    n, dev = wq.shape[0], xq.device
    b = None if bias is None else _f32(bias, dev)
    return xq.contiguous(), _f32(sx, dev), wq.contiguous(), _f32(sw, dev, n), b


def int8_gemm(mod, xq, sx, wq, sw, bias) -> Tensor:
    a, sx, b, sw, bias = _operands(xq, sx, wq, sw, bias)
    return mod.ops.int8_gemm(a, b, sx, sw, bias, _stream(a))


def int4_gemm(mod, xq, sx, wq, sw, bias) -> Tensor:
    """xq, wq: int8 tensors holding int4 values (|v| <= 7), packed two per byte here, then the s4 GEMM."""
    a, sx, b, sw, bias = _operands(xq, sx, wq, sw, bias)
    s = _stream(a)
    return mod.ops.int4_gemm(mod.ops.pack_int4(a, s), mod.ops.pack_int4(b, s), a.shape[1], sx, sw, bias, s)


def quantize_fp8(mod, x: Tensor, scale: Tensor | None, fp8_dtype) -> tuple[Tensor, Tensor]:
    s = None if scale is None else _f32(scale, x.device)
    q, s = mod.ops.quantize_fp8(x.contiguous(), s, _stream(x))
    return q.view(fp8_dtype), s


def fp8_gemm(mod, xq, sx, wq, sw, bias) -> Tensor:
    a, sx, b, sw, bias = _operands(xq, sx, wq, sw, bias)
    return mod.ops.fp8_gemm(a.view(torch.uint8), b.view(torch.uint8), sx, sw, bias, _stream(a))


def _pad_bytes(t: Tensor, rows: int, cols: int) -> Tensor:
    """Zero-pad a 2-d fp8 tensor (as bytes: padding float8 directly is not supported everywhere)."""
    if tuple(t.shape) == (rows, cols):
        return t.contiguous()
    u = torch.nn.functional.pad(t.contiguous().view(torch.uint8), (0, cols - t.shape[1], 0, rows - t.shape[0]))
    return u.view(t.dtype)


def scaled_mm(xq, sx, wq, sw, bias, fast_accum: bool = False) -> Tensor:
    """fp8 GEMM on cuBLASLt through torch._scaled_mm (fp32 out), zero-padded to the multiples of 16 it requires
    (exact). Per-tensor scales go to cuBLASLt, whose epilogue multiplies the accumulator by sx * sw as
    reference.epilogue does, so no pass over the output follows but the bias's; per-channel weight scales get
    reference.epilogue after unit scales. `fast_accum`: cuBLASLt's fast accumulation
    (dispatch.FP8_TRAINING_FAST_ACCUM)."""
    (m, k), n = xq.shape, wq.shape[0]
    mp, kp, np_ = -(-m // 16) * 16, -(-k // 16) * 16, -(-n // 16) * 16
    a, b = _pad_bytes(xq, mp, kp), _pad_bytes(wq, np_, kp)
    if sx.numel() == 1 and sw.numel() == 1:
        y = torch._scaled_mm(a, b.t(), scale_a=sx.float().reshape(()), scale_b=sw.float().reshape(()),
                             out_dtype=torch.float32, use_fast_accum=fast_accum)
        y = y[:m, :n].contiguous() if (mp, np_) != (m, n) else y
        return y if bias is None else y.add_(bias.float())
    one = torch.ones((), dtype=torch.float32, device=xq.device)
    acc = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32,
                           use_fast_accum=fast_accum)[:m, :n]
    return reference.epilogue(acc, sx, sw, bias, torch.float32)
