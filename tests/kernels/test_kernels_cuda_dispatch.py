"""The CUDA dispatch of kernels.ops, run on CPU: the new ops' torch paths, and the Python wiring into
the CUDA module's ops (argument order, packing, scale broadcasting) through a stand-in module whose
ops are the reference arithmetic. The real kernels' numbers are checked on a GPU (test_kernels_cuda.py).
"""

from __future__ import annotations

import types

import pytest
import torch

from qsync_opt.errors import SpecError
from qsync_opt.kernels import cuda_ops, dispatch, ops, reference
from qsync_opt.kernels.dispatch import Target


def _unpack_int4(p: torch.Tensor, k: int) -> torch.Tensor:
    lo, hi = (p & 0xF).to(torch.int16), (p >> 4).to(torch.int16)
    v = torch.stack([lo, hi], dim=-1).reshape(p.shape[0], -1)[:, :k]
    return torch.where(v > 7, v - 16, v).to(torch.int8)


class StandIn:
    """The CUDA module's op signatures (templates/cuda_binding.cpp.j2) over the reference arithmetic."""

    def __init__(self):
        self.calls = []
        self.ops = types.SimpleNamespace(**{n: self._rec(n) for n in (
            "quantize", "dequantize", "absmax", "int8_gemm", "pack_int4", "int4_gemm", "quantize_fp8", "fp8_gemm")})

    def _rec(self, name):
        def call(*args):
            self.calls.append(name)
            assert args[-1] == 0  # the stream comes last
            return getattr(self, "_" + name)(*args[:-1])
        return call

    def _quantize(self, x, scale, qmax, axis, stochastic, seed):
        bits = {127: 8, 7: 4}[qmax]
        return reference.quantize(x, bits=bits, axis=axis, scale=scale, stochastic=False, generator=None)

    def _dequantize(self, q, scale, axis):
        return reference.dequantize(q, scale, axis=axis, dtype=torch.float32)

    def _absmax(self, x, axis):
        return reference.absmax(x, axis)

    def _check(self, a, b, sx, sw):
        assert a.is_contiguous() and b.is_contiguous() and sx.shape == (1,) and sw.shape == (b.shape[0],)

    def _int8_gemm(self, a, b, sx, sw, bias):
        self._check(a, b, sx, sw)
        return reference.int8_linear(a, sx, b, sw, bias, torch.float32)

    def _pack_int4(self, q):
        q = q.to(torch.int16) & 0xF
        if q.shape[1] % 2:
            q = torch.nn.functional.pad(q, (0, 1))
        return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)

    def _int4_gemm(self, a, b, k, sx, sw, bias):
        assert a.dtype == torch.uint8 and a.shape[1] == (k + 1) // 2
        a, b = _unpack_int4(a, k), _unpack_int4(b, k)
        self._check(a, b, sx, sw)
        return reference.int8_linear(a, sx, b, sw, bias, torch.float32)

    def _quantize_fp8(self, x, scale):
        q, s = ops.quantize_fp8(x, "e4m3", scale=scale, impl="torch")
        return q.view(torch.uint8), s

    def _fp8_gemm(self, a, b, sx, sw, bias):
        assert a.dtype == torch.uint8
        self._check(a, b, sx, sw)
        a, b = a.view(torch.float8_e4m3fn), b.view(torch.float8_e4m3fn)
        return reference.epilogue(a.float() @ b.float().t(), sx, sw, bias, torch.float32)


@pytest.fixture
def standin(monkeypatch):
    mod = StandIn()
    monkeypatch.setattr(cuda_ops, "module", lambda device, impl, fmt="e4m3": mod)
    monkeypatch.setattr(cuda_ops, "_stream", lambda t: 0)
    return mod


def _as_sm(monkeypatch, sm):
    monkeypatch.setattr(ops.Target, "of_tensor", classmethod(lambda cls, t: Target("cuda", sm)))


@pytest.mark.parametrize("sm,expect", [(75, "int4_gemm"), (86, "int4_gemm"), (90, None)])
def test_int4_goes_to_the_s4_kernel_where_dispatch_says(monkeypatch, standin, sm, expect):
    _as_sm(monkeypatch, sm)
    g = torch.Generator().manual_seed(sm)
    xq = torch.randint(-7, 8, (33, 101), dtype=torch.int8, generator=g)
    wq = torch.randint(-7, 8, (40, 101), dtype=torch.int8, generator=g)
    sx, sw, b = torch.tensor(0.1), torch.rand(40, generator=g) + 0.01, torch.randn(40, generator=g)
    y = ops._int_linear_cuda("int4", xq, sx, wq, sw, b, torch.float32, "auto")
    assert torch.equal(y, reference.int8_linear(xq, sx, wq, sw, b, torch.float32))
    assert standin.calls == (["pack_int4", "pack_int4", "int4_gemm"] if expect else [])  # sm_90: torch._int_mm


def test_templated_int8_broadcasts_a_per_tensor_weight_scale(monkeypatch, standin):
    _as_sm(monkeypatch, 80)
    xq = torch.randint(-127, 128, (17, 64), dtype=torch.int8)
    wq = torch.randint(-127, 128, (5, 64), dtype=torch.int8)
    y = ops._int_linear_cuda("int8", xq, torch.tensor(0.02), wq, torch.tensor(0.5), None, torch.float32, "templated")
    assert standin.calls == ["int8_gemm"]
    assert torch.equal(y, reference.int8_linear(xq, torch.tensor(0.02), wq, torch.tensor(0.5), None, torch.float32))
    with pytest.raises(SpecError, match="impl='templated': the CUDA GEMMs write fp32"):
        ops._int_linear_cuda("int8", xq, torch.tensor(0.02), wq, torch.tensor(0.5), None, torch.bfloat16, "templated")


def test_quantize_fp8_matches_the_round_trip():
    x = torch.randn(300, 17) * 40
    for fmt in ("e4m3", "e5m2"):
        q, s = ops.quantize_fp8(x, fmt)
        rt, s2 = ops.fp8_roundtrip(x, fmt)
        assert torch.equal(s, s2) and torch.equal(q.float() * s, rt)


def test_fp8_linear_paths_agree(monkeypatch, standin):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(70, 200, generator=g), torch.randn(90, 200, generator=g)
    (xq, sx), (wq, sw) = ops.quantize_fp8(x, "e4m3"), ops.quantize_fp8(w, "e4m3")
    bias = torch.randn(90, generator=g)
    ref = ops.fp8_linear(xq, sx, wq, sw, bias)  # CPU: fp32 GEMM on the fp8 values
    assert torch.equal(ref, reference.epilogue(xq.float() @ wq.float().t(), sx, sw, bias, torch.float32))
    lib = cuda_ops.scaled_mm(xq, sx, wq, sw, bias)  # torch._scaled_mm, padded to multiples of 16
    assert torch.allclose(lib, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    _as_sm(monkeypatch, 90)
    tpl = ops.fp8_linear(xq, sx, wq, sw, bias, impl="templated")
    assert standin.calls == ["fp8_gemm"] and torch.equal(tpl, ref)
    with pytest.raises(SpecError, match="wq: .* does not match xq .* one K"):
        ops.fp8_linear(xq, sx, wq[:, :100].contiguous(), sw, bias)


def test_fp8_mixed_formats_take_scaled_mm_on_fp8_tensor_cores(monkeypatch, standin):
    """fp8 training's gradient GEMMs (e5m2 x e4m3) run torch._scaled_mm on sm_89+ whatever `kernels` says (the
    templated kernels take one format), an fp32 GEMM on the fp8 values elsewhere; both are that GEMM to fp32
    rounding (torch._scaled_mm runs on CPU tensors too, so its numbers are checked here)."""
    g = torch.Generator().manual_seed(1)
    (gq, sg), (wq, sw) = ops.quantize_fp8(torch.randn(40, 72, generator=g), "e5m2"), \
        ops.quantize_fp8(torch.randn(24, 72, generator=g), "e4m3")
    exact = (gq.double() @ wq.double().t()) * sg.double() * sw.double()
    cpu = ops.fp8_linear(gq, sg, wq, sw, None)  # no fp8 units: emulated
    assert torch.allclose(cpu.double(), exact, rtol=0, atol=1e-6 * float(exact.abs().max()))
    calls, real = [], cuda_ops.scaled_mm
    monkeypatch.setattr(cuda_ops, "scaled_mm", lambda *a, **k: calls.append("scaled_mm") or real(*a, **k))
    _as_sm(monkeypatch, 90)
    for impl in ("auto", "torch", "templated"):
        lib = ops.fp8_linear(gq, sg, wq, sw, None, impl=impl)
        assert torch.allclose(lib.double(), exact, rtol=0, atol=1e-6 * float(exact.abs().max()))
    assert calls == ["scaled_mm"] * 3 and standin.calls == []
    assert dispatch.fp8_backward_impl(Target("cuda", 90), "fp8_e4m3").op == dispatch.SCALED_MM
    assert dispatch.fp8_backward_impl(Target("cuda", 89), "fp8_e5m2").op == "qsync.cuda.fp8_mma"
    assert dispatch.fp8_backward_impl(Target("cuda", 80), "fp8_e4m3").kind == "emulation"
    assert dispatch.fp8_backward_impl(Target("cpu"), "fp8_e4m3").kind == "emulation"


def test_int4_linear_on_cpu_is_the_int8_path(impl):
    from qsync_opt.kernels import reference

    if impl == "templated" and not reference.cpu_int_mm_exact():
        pytest.skip("oneDNN's int8 GEMM is not exact on this CPU: impl='templated' refuses it")
    xq = torch.randint(-7, 8, (9, 48), dtype=torch.int8)
    wq = torch.randint(-7, 8, (6, 48), dtype=torch.int8)
    sx, sw = torch.tensor(0.3), torch.rand(6) + 0.1
    assert torch.equal(ops.int4_linear(xq, sx, wq, sw, None, impl=impl), ops.int8_linear(xq, sx, wq, sw, None, impl=impl))


def test_absmax_and_dequantize_on_cpu():
    x = torch.randn(7, 5)
    assert torch.equal(ops.absmax(x), x.abs().max()) and torch.equal(ops.absmax(x, axis=1), x.abs().amax(0))
    q, s = ops.quantize_symmetric(x, axis=0, impl="torch")
    assert torch.equal(ops.dequantize(q, s, axis=0, impl="torch"), q.float() * s[:, None])
    with pytest.raises(SpecError, match="impl: unknown value 'cuda'"):
        ops.dequantize(q, s, axis=0, impl="cuda")


def test_scaled_mm_hands_per_tensor_scales_to_the_gemm(monkeypatch):
    """Per-tensor scales ride in torch._scaled_mm (cuBLASLt's epilogue) and no pass over the output follows but the
    bias's; per-channel weight scales still take reference.epilogue. Both are the GEMM of the values to fp32 rounding
    (torch._scaled_mm runs on CPU tensors, so the numbers are checked here)."""
    g = torch.Generator().manual_seed(2)
    (xq, sx), (wq, sw) = ops.quantize_fp8(torch.randn(70, 200, generator=g), "e4m3"), \
        ops.quantize_fp8(torch.randn(90, 200, generator=g) * 3, "e4m3")
    bias = torch.randn(90, generator=g)
    exact = (xq.double() @ wq.double().t()) * sx.double() * sw.double() + bias.double()
    real = reference.epilogue
    used = []
    monkeypatch.setattr(reference, "epilogue", lambda *a: used.append(1) or real(*a))
    y = cuda_ops.scaled_mm(xq, sx, wq, sw, bias)
    assert used == [] and y.shape == (70, 90) and y.is_contiguous()
    assert torch.allclose(y.double(), exact, rtol=0, atol=1e-6 * float(exact.abs().max()))
    per_channel = torch.rand(90, generator=g) + 0.5
    y = cuda_ops.scaled_mm(xq, sx, wq, per_channel, None)
    assert used == [1]
    exact = (xq.double() @ wq.double().t()) * sx.double() * per_channel.double()
    assert torch.allclose(y.double(), exact, rtol=0, atol=1e-6 * float(exact.abs().max()))


@pytest.mark.parametrize("backward,expect", [("fp8", [True, False, False]), ("bf16", [False])])
def test_fp8_training_forward_accumulates_fast_and_its_gradients_do_not(monkeypatch, standin, backward, expect):
    """Under backward_precision 'fp8' an fp8 linear is torchao's float8 recipe on sm_90: torch._scaled_mm with
    use_fast_accum for the forward GEMM, without it for the two gradient GEMMs (dispatch.FP8_TRAINING_FAST_ACCUM);
    with a 16-bit backward the forward keeps the full accumulation. Checked by the calls the runtime makes (a CPU's
    torch._scaled_mm ignores the flag, so the numbers cannot show it)."""
    from qsync_opt.runtime.qmodules import SWAPPABLE
    from qsync_opt.runtime.recipe import Recipe

    _as_sm(monkeypatch, 90)
    fast, real = [], cuda_ops.scaled_mm
    monkeypatch.setattr(cuda_ops, "scaled_mm",
                        lambda *a, fast_accum=False: fast.append(fast_accum) or real(*a, fast_accum=fast_accum))
    torch.manual_seed(0)
    m = SWAPPABLE[torch.nn.Linear].from_float(torch.nn.Linear(32, 48), Recipe("fp8_e4m3", backward, "per_tensor",
                                                                              "nearest", "auto"))
    x = torch.randn(16, 32, requires_grad=True)
    m(x).backward(torch.randn(16, 48))
    assert fast == expect and torch.isfinite(x.grad).all() and standin.calls == []
