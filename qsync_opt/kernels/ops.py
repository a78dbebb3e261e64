"""The kernel ops the runtime calls: quantize, dequantize, absmax, int8/int4/fp8 linear, fp8 round trip, and the
CPU's int8 convolution (oneDNN's, where it is exact: int8_conv2d).

impl="templated" runs the rendered kernels (C++ on CPU tensors, CUDA on CUDA tensors; built once
and cached) and raises KernelBuildError if they do not build; impl="torch" is the PyTorch path
(reference.py, which uses torch._int_mm / torch._scaled_mm where they exist); impl="auto" takes
what kernels/dispatch.py chooses for the tensor's device, falling back to torch when a templated
build fails. Which GEMM runs where is decided only in dispatch.gemm_impl, the function the
planner's implementation table is built from; whether a CPU's int8 convolution runs oneDNN's convolution or im2col
and that GEMM is decided by int8_conv2d's exactness probe on the machine itself (a measured profile prices the one
that ran; the roofline prices both at the int8 rate). Bad arguments raise SpecError naming the argument, the value
and the fix.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Literal

import torch
from torch import Tensor

from qsync_opt.errors import KernelBuildError, SpecError
from qsync_opt.kernels import cuda_ops, reference
from qsync_opt.kernels.dispatch import Target, cuda_gemm_kinds, fp8_mixed_impl, gemm_impl
from qsync_opt.kernels.dtypes import FP8, TORCH_DTYPE, name_of

Impl = Literal["auto", "templated", "torch"]
IMPLS = ("auto", "templated", "torch")
#: Largest K for which an int32 accumulator of int8 products cannot overflow (K * 128 * 128 < 2**31).
MAX_K = 2**31 // (128 * 128) - 1

_state_lock = threading.Lock()
_auto_failure: KernelBuildError | None = None


def _module(impl: str):
    """The default CPU module for impl templated/auto, or None when the torch path must run."""
    global _auto_failure
    if impl not in IMPLS:
        raise SpecError(f"impl: unknown value {impl!r}; use one of {', '.join(IMPLS)}")
    if impl == "torch":
        return None
    from qsync_opt.kernels.registry import get_cpu_module  # import cost: jinja2 and the kernel build chain

    if impl == "templated":
        return get_cpu_module()
    with _state_lock:
        if _auto_failure is not None:
            return None
        try:
            return get_cpu_module()
        except KernelBuildError as e:
            _auto_failure = e
            warnings.warn(f"qsync_opt.kernels: templated CPU kernels unavailable, using the torch path:\n{e}",
                          RuntimeWarning, stacklevel=3)
            return None


def _templated_or_none(impl: str, ok: bool, why: str):
    """Module to use, or None; impl='templated' on an input it cannot take is an error, not a fallback."""
    if not ok:
        if impl == "templated":
            raise SpecError(f"impl='templated': {why}; pass impl='auto' or impl='torch' for this input")
        if impl not in IMPLS:
            raise SpecError(f"impl: unknown value {impl!r}; use one of {', '.join(IMPLS)}")
        return None
    return _module(impl)


def _covers(mod, impl: str, field: str, dtype: torch.dtype, have: str) -> bool:
    """Whether the loaded module was instantiated for `dtype` (mod.spec.<have>)."""
    if mod is None:
        return False
    name, have = name_of(dtype, field), getattr(mod.spec, have)
    if name in have:
        return True
    if impl == "templated":
        raise SpecError(f"{field}: {name} is not instantiated in the CPU kernel build ({', '.join(have)}); "
                        "use impl='auto' or impl='torch'")
    return False


def _cuda_module_or_none(impl: str, ok: bool, why: str, device, fp8_format: str = "e4m3"):
    """The CUDA module for `device`, or None (torch path); impl='templated' on an input the kernels
    cannot take is an error, not a fallback."""
    if impl not in IMPLS:
        raise SpecError(f"impl: unknown value {impl!r}; use one of {', '.join(IMPLS)}")
    if not ok:
        if impl == "templated":
            raise SpecError(f"impl='templated': {why}; pass impl='auto' or impl='torch' for this input")
        return None
    return cuda_ops.module(device, impl, fp8_format)


def available(impl: str = "templated") -> bool:
    """Whether `impl` can run here (for 'templated'/'auto': whether the CPU kernels build and load)."""
    if impl == "torch":
        return True
    try:
        return _module("templated") is not None
    except KernelBuildError:
        return False


def _norm_axis(axis, x: Tensor) -> int | None:
    if axis is None:
        return None
    if not isinstance(axis, int) or isinstance(axis, bool) or not -x.dim() <= axis < max(x.dim(), 1):
        raise SpecError(f"axis: {axis!r} is not an axis of a {x.dim()}-d tensor; use None or -{x.dim()}..{x.dim() - 1}")
    return axis % x.dim()


def _check_scale(scale: Tensor, expected: int, field: str = "scale") -> Tensor:
    if not isinstance(scale, Tensor) or scale.numel() != expected:
        got = tuple(scale.shape) if isinstance(scale, Tensor) else type(scale).__name__
        raise SpecError(f"{field}: got {got}, need a tensor of {expected} element(s) (one per channel, or one for per-tensor)")
    s = scale.float().reshape(() if expected == 1 else (expected,))
    if not bool(torch.all(torch.isfinite(s) & (s > 0))):
        raise SpecError(f"{field}: holds non-positive or non-finite values ({s.min().item()}); scales must be > 0")
    return s


def quantize_symmetric(x: Tensor, *, bits: int = 8, axis: int | None = None, scale: Tensor | None = None,
                       stochastic: bool = False, generator: torch.Generator | None = None,
                       impl: Impl = "auto") -> tuple[Tensor, Tensor]:
    """Symmetric quantization: scale = amax/qmax (qmax = 2**(bits-1)-1: 127 for int8, 7 for int4),
    computed per tensor (axis=None) or per slice along `axis` (per-output-channel weights), unless `scale` is given.
    Returns (q int8 tensor with values clamped to [-qmax, qmax], scale float32 tensor (shape [] or [x.shape[axis]])).
    Round to nearest-even by default; stochastic rounding if asked. amax==0 -> scale 1 (no div by zero).
    The templated and torch paths draw different noise for stochastic rounding; each is reproducible
    with `generator` (or with torch.manual_seed when generator is None)."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise SpecError(f"x: expected a floating tensor, got {getattr(x, 'dtype', type(x).__name__)}; "
                        "quantize float activations or weights")
    if not isinstance(bits, int) or not 2 <= bits <= 8:
        raise SpecError(f"bits: {bits!r} is not supported; use an int in 2..8 (8 for int8, 4 for int4)")
    axis = _norm_axis(axis, x)
    channels = 1 if axis is None else x.shape[axis]
    if scale is not None:
        scale = _check_scale(scale, channels)
    if x.is_cuda:
        mod = _cuda_module_or_none(impl, x.dtype == torch.float32 and x.numel() > 0,
                                   f"the CUDA kernels read non-empty fp32 tensors, got {x.dtype} with {x.numel()} "
                                   "elements", x.device)
        if mod is not None:
            seed = int(torch.randint(0, 2**62, (), generator=generator)) if stochastic else 0
            return cuda_ops.quantize(mod, x, scale, reference.qmax_of(bits), axis, bool(stochastic), seed)
        return reference.quantize(x, bits=bits, axis=axis, scale=scale, stochastic=stochastic, generator=generator)
    ok = x.device.type == "cpu" and x.dtype in TORCH_DTYPE.values() and x.numel() > 0
    mod = _templated_or_none(impl, ok, f"needs a non-empty CPU tensor of {'/'.join(TORCH_DTYPE)}, "
                                       f"got {x.dtype} on {x.device} with {x.numel()} elements")
    if _covers(mod, impl, "x.dtype", x.dtype, "in_dtypes"):
        seed = int(torch.randint(0, 2**62, (), generator=generator)) if stochastic else 0
        return mod.ops.quantize(x, scale, reference.qmax_of(bits), axis, bool(stochastic), seed)
    return reference.quantize(x, bits=bits, axis=axis, scale=scale, stochastic=stochastic, generator=generator)


def dequantize(q: Tensor, scale: Tensor, *, axis: int | None = None, dtype=torch.float32,
               impl: Impl = "auto") -> Tensor:
    """x ≈ q * scale (broadcast along `axis` for per-channel scales), returned in `dtype`.
    CUDA tensors go through the templated kernel when dtype is fp32; CPU tensors through torch."""
    if not isinstance(q, Tensor) or q.dtype != torch.int8:
        raise SpecError(f"q: expected an int8 tensor, got {getattr(q, 'dtype', type(q).__name__)}; pass quantize_symmetric's q")
    axis = _norm_axis(axis, q)
    s = _check_scale(scale, 1 if axis is None else q.shape[axis])
    if q.is_cuda:
        mod = _cuda_module_or_none(impl, dtype == torch.float32 and q.numel() > 0,
                                   f"the CUDA kernel writes fp32, asked for {dtype}", q.device)
        if mod is not None:
            return cuda_ops.dequantize(mod, q, s, axis)
    elif impl not in IMPLS:
        raise SpecError(f"impl: unknown value {impl!r}; use one of {', '.join(IMPLS)}")
    return reference.dequantize(q, s, axis=axis, dtype=dtype)


def absmax(x: Tensor, *, axis: int | None = None, impl: Impl = "auto") -> Tensor:
    """max |x| in fp32: a scalar, or one value per slice along `axis` (templated kernel on CUDA fp32)."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise SpecError(f"x: expected a floating tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    axis = _norm_axis(axis, x)
    if x.is_cuda:
        mod = _cuda_module_or_none(impl, x.dtype == torch.float32 and x.numel() > 0,
                                   f"the CUDA kernel reads non-empty fp32 tensors, got {x.dtype}", x.device)
        if mod is not None:
            return cuda_ops.absmax(mod, x, axis)
    elif impl not in IMPLS:
        raise SpecError(f"impl: unknown value {impl!r}; use one of {', '.join(IMPLS)}")
    return reference.absmax(x, axis)


def _check_linear(xq, sx, wq, sw, bias, out_dtype):
    for field, t in (("xq", xq), ("wq", wq)):
        if not isinstance(t, Tensor) or t.dtype != torch.int8 or t.dim() != 2:
            raise SpecError(f"{field}: expected a 2-d int8 tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}; "
                            "quantize first and flatten leading dims to (rows, features)")
    (_m, k), (n, kw) = xq.shape, wq.shape
    if k != kw:
        raise SpecError(f"wq: shape {(n, kw)} does not match xq's K={k}; wq must be (out_features, {k})")
    if k > MAX_K:
        raise SpecError(f"xq: K={k} exceeds {MAX_K}, where the int32 accumulator could overflow; split K")
    if xq.device != wq.device:
        raise SpecError(f"wq: on {wq.device} but xq on {xq.device}; move both to one device")
    sx = _check_scale(sx, 1, "sx")
    sw = _check_scale(sw, 1 if sw is not None and sw.numel() == 1 else n, "sw")
    if bias is not None and (not isinstance(bias, Tensor) or bias.numel() != n):
        raise SpecError(f"bias: expected {n} values, got {tuple(getattr(bias, 'shape', ()))}; pass None or shape ({n},)")
    if out_dtype not in TORCH_DTYPE.values():
        raise SpecError(f"out_dtype: {out_dtype} not supported; use torch.float32 or torch.bfloat16 (fp16: torch path)")
    return sx.to(xq.device), sw.to(xq.device)


def int8_linear(xq: Tensor, sx: Tensor, wq: Tensor, sw: Tensor, bias: Tensor | None, *,
                out_dtype=torch.float32, impl: Impl = "auto") -> Tensor:
    """y = (xq @ wq.T) * sx * sw (+ bias). xq: int8 (M, K) [callers flatten leading dims], wq: int8 (N, K),
    sx: scalar per-tensor scale, sw: scalar or per-output-channel (N,). int32 accumulation (exact), fused
    dequantising epilogue (int32 → fp32/bf16 with scales and bias), computed as
    (float(acc) * (sx * sw)) + bias in fp32 and rounded once to out_dtype. Used for int8 and int4
    (int4 values are int8 tensors clamped to ±7 — same GEMM, bit-exact)."""
    sx, sw = _check_linear(xq, sx, wq, sw, bias, out_dtype)
    if xq.is_cuda:
        return _int_linear_cuda("int8", xq, sx, wq, sw, bias, out_dtype, impl)
    ok = xq.device.type == "cpu" and out_dtype in (torch.float32, torch.bfloat16) and xq.shape[0] > 0
    mod = _templated_or_none(impl, ok, f"needs CPU tensors, M > 0 and out_dtype fp32/bf16, got {xq.device}, "
                                       f"M={xq.shape[0]}, {out_dtype}")
    if mod is not None and not reference.cpu_int_mm_exact():  # its oneDNN GEMM saturates here: the exact path runs
        if impl == "templated":
            raise SpecError("impl='templated': the CPU int8 GEMM is not exact on this CPU (oneDNN without VNNI "
                            "saturates pairs of products at int16); use impl='auto' or 'torch', which are exact")
        mod = None
    if _covers(mod, impl, "out_dtype", out_dtype, "out_dtypes"):
        return mod.ops.int8_linear(xq, sx, wq, sw, bias, out_dtype)
    return reference.int8_linear(xq, sx, wq, sw, bias, out_dtype)


def fp8_roundtrip(x: Tensor, fmt: Literal["e4m3", "e5m2"], *, scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Exact emulation of an fp8 cast: scale to the format's max (amax/448 for e4m3, /57344 for e5m2) unless given,
    cast to torch.float8_e4m3fn / float8_e5m2 and back; returns (x_roundtripped_float32 (already multiplied back by scale), scale).
    Values beyond the format's range after scaling saturate to ±max (as fp8 training recipes do)."""
    if fmt not in FP8:
        raise SpecError(f"fmt: unknown fp8 format {fmt!r}; use one of {', '.join(FP8)}")
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise SpecError(f"x: expected a floating tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if scale is not None:
        if not isinstance(scale, Tensor):
            raise SpecError(f"scale: expected a tensor, got {type(scale).__name__}")
        try:
            torch.broadcast_shapes(scale.shape, x.shape)
        except RuntimeError:
            raise SpecError(f"scale: shape {tuple(scale.shape)} does not broadcast to x {tuple(x.shape)}") from None
        _check_scale(scale.reshape(-1), scale.numel())
    return reference.fp8_roundtrip(x, fmt, scale)


def _int_linear_cuda(precision: str, xq, sx, wq, sw, bias, out_dtype, impl) -> Tensor:
    """Run the GEMM dispatch.gemm_impl names for this CUDA device (templated kernels write fp32)."""
    choice = gemm_impl(Target.of_tensor(xq), precision, impl)
    if choice.kind == "emulation":  # int4 as ±7 codes through the int8 path
        return _int_linear_cuda(choice.via, xq, sx, wq, sw, bias, out_dtype, impl)
    if choice.kind == "templated":
        mod = _cuda_module_or_none(impl, out_dtype == torch.float32 and xq.shape[0] > 0,
                                   f"the CUDA GEMMs write fp32 with M > 0, asked for {out_dtype}, M={xq.shape[0]}",
                                   xq.device)
        if mod is not None:
            run = cuda_ops.int4_gemm if choice.op == "qsync.cuda.int4_wmma" else cuda_ops.int8_gemm
            return run(mod, xq, sx, wq, sw, bias)
    return reference.int8_linear(xq, sx, wq, sw, bias, out_dtype)


def int4_linear(xq: Tensor, sx: Tensor, wq: Tensor, sw: Tensor, bias: Tensor | None, *,
                out_dtype=torch.float32, impl: Impl = "auto") -> Tensor:
    """int8_linear for int4 codes (int8 tensors with |v| <= 7): the templated s4 tensor-core GEMM where
    dispatch names it (CUDA sm_75..sm_89), else the int8 path on the same codes (bit-identical result)."""
    sx, sw = _check_linear(xq, sx, wq, sw, bias, out_dtype)
    if xq.is_cuda:
        return _int_linear_cuda("int4", xq, sx, wq, sw, bias, out_dtype, impl)
    return int8_linear(xq, sx, wq, sw, bias, out_dtype=out_dtype, impl=impl)


def _fmt_of(dtype) -> str | None:
    return next((f for f, info in FP8.items() if info["torch"] == dtype), None)


def quantize_fp8(x: Tensor, fmt: Literal["e4m3", "e5m2"], *, scale: Tensor | None = None,
                 impl: Impl = "auto") -> tuple[Tensor, Tensor]:
    """fp8 codes of x / scale (saturated to the format's largest finite value, round to nearest even)
    and the per-tensor scale (amax / max unless given): the values fp8_roundtrip multiplies back.
    Templated kernel on CUDA devices with fp8 tensor cores, else torch."""
    if fmt not in FP8:
        raise SpecError(f"fmt: unknown fp8 format {fmt!r}; use one of {', '.join(FP8)}")
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise SpecError(f"x: expected a floating tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if scale is not None:
        scale = _check_scale(scale, 1)
    info = FP8[fmt]
    if x.is_cuda and "fp8" in cuda_gemm_kinds(Target.of_tensor(x).sm):
        mod = _cuda_module_or_none(impl, x.dtype == torch.float32 and x.numel() > 0,
                                   f"the CUDA kernel reads non-empty fp32 tensors, got {x.dtype}", x.device, fmt)
        if mod is not None:
            return cuda_ops.quantize_fp8(mod, x, scale, info["torch"])
    elif impl not in IMPLS:
        raise SpecError(f"impl: unknown value {impl!r}; use one of {', '.join(IMPLS)}")
    xf = x.float()
    s = reference.scale_from_amax(reference.absmax(xf, None), info["max"]) if scale is None else scale.to(xf.device)
    return (xf / s).clamp_(-info["max"], info["max"]).to(info["torch"]), s


def fp8_linear(xq: Tensor, sx: Tensor, wq: Tensor, sw: Tensor, bias: Tensor | None, *,
               impl: Impl = "auto", fast_accum: bool = False) -> Tensor:
    """y = (xq @ wq.T) * sx * sw (+ bias) in fp32 for fp8 codes xq (M, K) and wq (N, K): fp8 tensor cores
    (torch._scaled_mm or the templated mma kernel) where dispatch names them, else an fp32 GEMM on the fp8 values
    (exact products, fp32 accumulation). Both of one format, or e5m2 with e4m3 (fp8 training's gradient GEMMs:
    dispatch.fp8_mixed_impl); e5m2 with e5m2 never goes to torch._scaled_mm, which refuses it. `fast_accum`:
    torch._scaled_mm's use_fast_accum (dispatch.FP8_TRAINING_FAST_ACCUM); the other paths accumulate in fp32."""
    for field, t in (("xq", xq), ("wq", wq)):
        if not isinstance(t, Tensor) or _fmt_of(t.dtype) is None or t.dim() != 2:
            raise SpecError(f"{field}: expected a 2-d float8 tensor, got {getattr(t, 'dtype', type(t).__name__)} "
                            f"{tuple(getattr(t, 'shape', ()))}; use quantize_fp8 and flatten to (rows, features)")
    if xq.shape[1] != wq.shape[1] or xq.device != wq.device:
        raise SpecError(f"wq: {wq.dtype} {tuple(wq.shape)} on {wq.device} does not match xq {xq.dtype} "
                        f"{tuple(xq.shape)} on {xq.device}; both need one K and one device")
    n = wq.shape[0]
    sx = _check_scale(sx, 1, "sx").to(xq.device)
    sw = _check_scale(sw, 1 if sw is not None and sw.numel() == 1 else n, "sw").to(xq.device)
    fmt = _fmt_of(xq.dtype)
    target = Target.of_tensor(xq)
    choice = gemm_impl(target, f"fp8_{fmt}", impl) if xq.dtype == wq.dtype else fp8_mixed_impl(target, impl)
    if choice.kind == "library" and xq.shape[0] > 0:
        return cuda_ops.scaled_mm(xq, sx, wq, sw, bias, fast_accum=fast_accum)
    if choice.kind == "templated":
        mod = _cuda_module_or_none(impl, xq.shape[0] > 0, "M must be > 0", xq.device, fmt)
        if mod is not None:
            return cuda_ops.fp8_gemm(mod, xq, sx, wq, sw, bias)
    return reference.epilogue(xq.float() @ wq.float().t(), sx, sw, bias, torch.float32)


# ---- int8 convolution on CPU: oneDNN's, where it is exact here ------------------------------------------------


def _onednn_conv_acc(xq: Tensor, wq: Tensor, stride, padding, dilation, groups: int) -> Tensor:
    """float(conv2d(xq, wq)) of int8 codes through oneDNN's int8 convolution (u8 activations: the codes' bit pattern
    xor 0x80 is codes + 128, given with zero point 128; unit scales, so the fp32 output is the int32 accumulator
    converted once)."""
    oc = wq.shape[0]
    ones = torch.ones(oc, dtype=torch.float32)
    xu = xq.view(torch.uint8).bitwise_xor(128)
    st, pd, dl = list(stride), list(padding), list(dilation)
    packed = torch.ops.onednn.qconv_prepack(wq, ones, 1.0, 128, st, pd, dl, groups, list(xq.shape))
    return torch.ops.onednn.qconv2d_pointwise(xu, 1.0, 128, packed, ones, torch.zeros(oc, dtype=torch.int64), None,
                                              st, pd, dl, groups, 1.0, 0, torch.float32, "none", [], None)


@functools.lru_cache(maxsize=1)
def onednn_conv_exact() -> bool:
    """Whether oneDNN's int8 convolution returns the exact integer accumulator in this process: it must where the
    CPU has VNNI; without it (AVX2, or oneDNN capped by ONEDNN_MAX_CPU_ISA) its u8 x s8 pair products saturate at
    int16 and it does not. Probed once per process on all-extreme codes (255 x ±127 twice overflows int16, so every pair saturates where any does) and
    on random ones, against the float64 convolution of the same codes (exact: |sums| < 2**53)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qconv2d_pointwise")):
        return False
    g = torch.Generator().manual_seed(0)
    cases = [(torch.full((2, 64, 6, 6), 127, dtype=torch.int8), torch.full((16, 64, 3, 3), 127, dtype=torch.int8)),
             (torch.full((2, 64, 6, 6), 127, dtype=torch.int8), torch.full((16, 64, 3, 3), -127, dtype=torch.int8)),
             (torch.randint(-128, 128, (2, 64, 6, 6), dtype=torch.int8, generator=g),
              torch.randint(-127, 128, (16, 64, 3, 3), dtype=torch.int8, generator=g))]
    try:
        for x, w in cases:
            exact = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
            if not torch.equal(_onednn_conv_acc(x, w, (1, 1), (1, 1), (1, 1), 1).double(), exact):
                return False
    except RuntimeError:  # a build whose oneDNN lacks the op for this ISA
        return False
    return True


FP32_EXACT = reference.FP32_EXACT


def _fp32_conv_acc(xq: Tensor, wq: Tensor, stride, padding, dilation, groups: int, qmax: int) -> Tensor | None:
    """conv2d(xq, wq) of integer codes (|codes| ≤ qmax) through oneDNN's fp32 direct convolution on their values:
    exact when no partial sum can pass 2**24, i.e. (input channels per call) × kh × kw × qmax² ≤ 2**24; with one
    group the input channels are split into calls that size, their exact results summed in int32. The fp32 result
    (one call) or int32 (several); None where a group's channels cannot be split (groups > 1 and too many)."""
    per_channel = wq.shape[2] * wq.shape[3] * qmax * qmax
    chunk, cin = FP32_EXACT // per_channel, wq.shape[1]
    if chunk < 1 or (groups > 1 and cin > chunk):
        return None
    st, pd, dl = list(stride), list(padding), list(dilation)
    if cin <= chunk:
        return torch.ops.aten.mkldnn_convolution(xq.float(), wq.float(), None, pd, st, dl, groups)
    acc = None
    for c0 in range(0, cin, chunk):
        part = torch.ops.aten.mkldnn_convolution(xq[:, c0:c0 + chunk].float(), wq[:, c0:c0 + chunk].float(), None,
                                                 pd, st, dl, 1).to(torch.int32)
        acc = part if acc is None else acc.add_(part)
    return acc


@functools.lru_cache(maxsize=1)
def fp32_conv_exact() -> bool:
    """Whether oneDNN's fp32 convolution sums integer products exactly in this process (it does unless its fp32 math
    is lowered, e.g. to bf16): probed once at the bound, 115 channels × 3 × 3 × 127² < 2**24, on all-extreme and on
    random codes, against the float64 convolution."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.aten, "mkldnn_convolution")):
        return False
    g = torch.Generator().manual_seed(0)
    c = FP32_EXACT // (9 * 127 * 127)
    cases = [(torch.full((1, c, 5, 5), 127, dtype=torch.int8), torch.full((4, c, 3, 3), 127, dtype=torch.int8)),
             (torch.randint(-127, 128, (2, c, 5, 5), dtype=torch.int8, generator=g),
              torch.randint(-127, 128, (4, c, 3, 3), dtype=torch.int8, generator=g))]
    try:
        for x, w in cases:
            got = _fp32_conv_acc(x, w, (1, 1), (1, 1), (1, 1), 1, 127)
            if got is None or not torch.equal(got.double(), torch.nn.functional.conv2d(x.double(), w.double(), padding=1)):
                return False
    except RuntimeError:
        return False
    return True


def int8_conv2d(xq: Tensor, sx: Tensor, wq: Tensor, sw: Tensor, bias: Tensor | None, stride, padding, dilation,
                groups: int, *, qmax: int = 127, impl: Impl = "auto") -> Tensor | None:
    """y = conv2d(xq, wq) * sx * sw (+ bias), fp32 NCHW: int8 codes (N, C, H, W) and (O, C/groups, kh, kw) with
    |codes| ≤ qmax (127 int8, 7 int4), sx a per-tensor scale, sw per output channel (O,) or one; zero padding. The
    exact integer accumulator from oneDNN's int8 convolution where it is exact here (onednn_conv_exact: VNNI), else
    from its fp32 convolution on the codes' values where no partial sum can pass 2**24 (fp32_conv_exact); then the
    epilogue int8_linear's, float(acc) * (sx * sw) then + bias in fp32: bit-equal to im2col and the int8 GEMM. None
    where neither runs here (a CUDA or non-int8 tensor, too many channels per group for fp32, impl='templated'):
    the caller's im2col and int8_linear path runs instead."""
    if impl == "templated" or xq.device.type != "cpu" or xq.dtype != torch.int8 or xq.dim() != 4:
        return None
    xq, wq = xq.contiguous(), wq.contiguous()
    if onednn_conv_exact():
        acc = _onednn_conv_acc(xq, wq, stride, padding, dilation, groups)
    elif fp32_conv_exact():
        acc = _fp32_conv_acc(xq, wq, stride, padding, dilation, groups, qmax)
    else:
        acc = None
    if acc is None:
        return None
    s = (sx.float().reshape(()) * sw.float().reshape(-1)).view(1, -1, 1, 1)
    y = torch.empty(acc.shape, dtype=torch.float32)  # NCHW, as im2col's (oneDNN's int8 accumulator is NHWC)
    torch.mul(acc, s, out=y)  # an int32 accumulator is promoted inside the product: float(acc) * s, as int8_linear
    if bias is not None:
        y.add_(bias.float().view(1, -1, 1, 1))
    return y
