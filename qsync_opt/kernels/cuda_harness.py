"""A ctypes harness over the rendered CUDA kernels, for numerical checks on a machine with a GPU.

Builds the spec's .cu as a shared library with nvcc (no torch extension build needed) and calls
its extern "C" launchers on torch CUDA tensors. Used by tests/kernels (skipped without CUDA) and
by anyone who wants to time the kernels without the torch extension; the runtime's ops load the
same kernels as a torch extension (registry.get_cuda_module) and dispatch to them (ops.py).
"""

from __future__ import annotations

import ctypes as C

import torch

from qsync_opt.errors import KernelBuildError, SpecError
from qsync_opt.kernels.dispatch import cuda_arch
from qsync_opt.kernels.dtypes import FP8, TORCH_DTYPE
from qsync_opt.kernels.reference import qmax_of
from qsync_opt.kernels.registry import compile_cuda
from qsync_opt.kernels.spec import CudaSpec, cuda_archs

_P, _I64, _I, _F = C.c_void_p, C.c_int64, C.c_int, C.c_float
_SIGS = {
    "qsync_quantize": [_P, _P, _P, _I64, _I64, _I64, _I, _F, _I, C.c_uint64, _P],
    "qsync_dequantize": [_P, _P, _P, _I64, _I64, _I64, _P],
    "qsync_int8_gemm": [_P, _P, _P, _I, _I, _I, _P, _P, _P, _P],
    "qsync_pack_int4": [_P, _P, _I64, _I64, _P],
    "qsync_int4_gemm": [_P, _P, _P, _I, _I, _I, _P, _P, _P, _P],
    "qsync_quantize_fp8": [_P, _P, _P, _I64, _I, _P],
    "qsync_fp8_gemm": [_P, _P, _P, _I, _I, _I, _P, _P, _P, _P],
}


def arch_for_device(device=None) -> str:
    """The newest tiles.yaml arch not newer than the device (its PTX JITs forward on newer GPUs)."""
    major, minor = torch.cuda.get_device_capability(device)
    arch = cuda_arch(major * 10 + minor)
    if arch is None:
        raise SpecError(f"device capability sm_{major}{minor} is older than every arch in tiles.yaml "
                        f"({', '.join(cuda_archs())})")
    return arch


def _ptr(t: torch.Tensor | None):
    return None if t is None else C.c_void_p(t.data_ptr())


def _layout(x: torch.Tensor, axis: int | None) -> tuple[int, int, int]:
    if axis is None:
        return 1, 1, x.numel()
    outer = 1
    for d in x.shape[:axis]:
        outer *= d
    inner = 1
    for d in x.shape[axis + 1:]:
        inner *= d
    return outer, x.shape[axis], inner


class CudaKernels:
    """The launchers of one CudaSpec, loaded through ctypes."""

    def __init__(self, spec: CudaSpec | None = None, *, cache_dir=None):
        if not torch.cuda.is_available():
            raise KernelBuildError("CudaKernels needs a CUDA device and a CUDA build of torch")
        self.spec = spec or CudaSpec(arch=arch_for_device())
        self.artefacts = compile_cuda(self.spec, cache_dir=cache_dir, mode="shared", check_binding=False)
        self.lib = C.CDLL(str(self.artefacts.output))
        for name, args in _SIGS.items():
            if hasattr(self.lib, name):
                fn = getattr(self.lib, name)
                fn.argtypes, fn.restype = args, C.c_int

    @property
    def _stream(self):
        return C.c_void_p(torch.cuda.current_stream().cuda_stream)

    def _call(self, name: str, *args) -> None:
        if not hasattr(self.lib, name):
            raise SpecError(f"{name}: not compiled for {self.spec.arch}; kinds here: "
                            f"{', '.join(t.kind for t in self.spec.tiles)}")
        err = getattr(self.lib, name)(*args, self._stream)
        if err:
            raise RuntimeError(f"{name} failed with CUDA error {err}")

    def quantize(self, x, *, bits=8, axis=None, scale=None, stochastic=False, seed=0):
        x = x.contiguous()
        outer, ch, inner = _layout(x, axis)
        q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
        s = scale.float().reshape(ch).clone() if scale is not None else torch.empty(ch, device=x.device)
        self._call("qsync_quantize", _ptr(x), _ptr(q), _ptr(s), outer, ch, inner, int(scale is None),
                   float(qmax_of(bits)), int(stochastic), seed)
        return q, (s.reshape(()) if axis is None else s)

    def dequantize(self, q, scale, *, axis=None):
        outer, ch, inner = _layout(q, axis)
        y = torch.empty(q.shape, dtype=TORCH_DTYPE[self.spec.in_dtype], device=q.device)
        self._call("qsync_dequantize", _ptr(q.contiguous()), _ptr(y), _ptr(scale.float().contiguous()), outer, ch, inner)
        return y

    def _gemm(self, name, a, b, k, sx, sw, bias):
        dev = a.device
        c = torch.empty(a.shape[0], b.shape[0], dtype=TORCH_DTYPE[self.spec.out_dtype], device=dev)
        sx = sx.to(dev, torch.float32).reshape(1).contiguous()  # locals keep every buffer alive over the call
        sw = sw.to(dev, torch.float32).reshape(-1).contiguous()
        if self.spec.granularity == "channel" and sw.numel() == 1:
            sw = sw.expand(b.shape[0]).contiguous()
        if self.spec.granularity == "tensor" and sw.numel() != 1:
            raise SpecError(f"sw: {sw.numel()} scales, but {self.spec.name} was rendered for per-tensor weight "
                            "scales; render a CudaSpec with granularity='channel'")
        bias = None if bias is None else bias.to(dev, torch.float32).contiguous()
        self._call(name, _ptr(a), _ptr(b), _ptr(c), a.shape[0], b.shape[0], k, _ptr(sx), _ptr(sw), _ptr(bias))
        return c

    def int8_linear(self, xq, sx, wq, sw, bias=None):
        return self._gemm("qsync_int8_gemm", xq.contiguous(), wq.contiguous(), xq.shape[1], sx, sw, bias)

    def pack_int4(self, q):
        q = q.contiguous()
        p = torch.empty(q.shape[0], (q.shape[1] + 1) // 2, dtype=torch.uint8, device=q.device)
        self._call("qsync_pack_int4", _ptr(q), _ptr(p), q.shape[0], q.shape[1])
        return p

    def int4_linear(self, xq, sx, wq, sw, bias=None):
        """xq, wq: int8 tensors holding int4 values (|v| <= 7); packed here, then the s4 GEMM."""
        return self._gemm("qsync_int4_gemm", self.pack_int4(xq), self.pack_int4(wq), xq.shape[1], sx, sw, bias)

    def quantize_fp8(self, x, scale=None):
        x = x.contiguous()
        q = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
        s = scale.float().reshape(1).clone() if scale is not None else torch.empty(1, device=x.device)
        self._call("qsync_quantize_fp8", _ptr(x), _ptr(q), _ptr(s), x.numel(), int(scale is None))
        return q.view(FP8[self.spec.fp8_format]["torch"]), s.reshape(())

    def fp8_linear(self, xq, sx, wq, sw, bias=None):
        """xq (M, K), wq (N, K): fp8 tensors of the spec's format (from quantize_fp8)."""
        return self._gemm("qsync_fp8_gemm", xq.contiguous().view(torch.uint8), wq.contiguous().view(torch.uint8),
                          xq.shape[1], sx, sw, bias)
