"""QSync's bi-directional ("GVAR") indicator, from a few FP32 calibration batches.

Per selectable op, hooks collect: element counts D_x, D_w, D_o of input, weight and output;
plain (not squared, as in QSync's code) Frobenius norms ‖X‖, ‖W‖, ‖∇W‖; absmax of X and W;
and the typical magnitude (RMS) of X, W and the output gradient G. Then, with
s = absmax / qmax and a float format's round-off constant k:

  integer  F = (‖W‖·s_x²·D_x + ‖X‖·s_w²·D_w) / 6
           B = (‖∇W‖·s_x²·D_x + ‖X‖·2^(2e_g)·2^(−2k_b)·D_o) / 6
  float    F = 2^(−2k)·(‖W‖·D_x·2^(2e_x) + ‖X‖·D_w·2^(2e_w)) / 6
           B = (‖∇W‖·D_x·2^(2e_x)·2^(−2k) + ‖X‖·D_o·2^(2e_g)·2^(−2k_g)) / 6
  fp32     0
  ω = γ·(L − d)·F + d·B, γ = 4 (sensitivity.py), normalised the same way as the weight one.

Choices, and where they differ from QSync's code:
- k = mantissa bits − 1: fp16 (10 bits) gives QSync's k = 9; bf16 (7) k = 6; tf32 k = 9;
  fp8_e4m3 k = 2; fp8_e5m2 k = 1. So each float format's term is 2^(−2k): bf16 is 2^6 = 64x
  noisier than fp16.
- e_t = floor(log2 RMS(t)), the binary exponent of the typical magnitude, and it enters as
  2^(2e) (the squared magnitude the round-off scales with), as in QSync's INT8 backward term.
  QSync's FP16 terms use e linearly with a cap of 5; that form is zero or negative for the
  sub-unit magnitudes of weights, so we do not copy it.
- The INT8 backward gradient term uses the output gradient's exponent e_g (QSync writes e_x)
  at the runtime's backward precision k_b; integer and fp8 ops run backward at k_b
  (k_g = k_b), float ops at their own k (k_g = k). Under backward_precision 'fp8' an fp8 linear
  multiplies an e5m2 gradient (k_g = 1), every other integer or fp8 op runs its backward in bf16.
- Embedding: X is one-hot (exact in every format): s_x = 0, ‖X‖ = sqrt(number of indices).
- Ops without a module (functional matmul) get unit-RMS Gaussian surrogate statistics; noted.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from qsync_opt.errors import ModelError, SpecError
from qsync_opt.kernels.dispatch import GRAD_FP8
from qsync_opt.models.graph import OpGraph, OpNode
from qsync_opt.precision import BITS, INTEGER, MANTISSA_BITS
from qsync_opt.runtime.recipe import FP8_BACKWARD_FALLBACK
from qsync_opt.training.predictor.costs import fp8_grads
from qsync_opt.training.predictor.sensitivity import GAMMA, Sensitivity, check_precisions, depth_loading, normalise


def qmax(precision: str) -> int:
    """Largest code of a symmetric integer format: 127 for int8, 7 for int4."""
    return 2 ** (BITS[precision] - 1) - 1


def round_off_k(precision: str) -> int:
    """k in the 2^(−2k) round-off term: mantissa bits − 1 (fp16: 9, as QSync)."""
    return MANTISSA_BITS[precision] - 1


@dataclass
class OpStats:
    """Calibration statistics of one op, averaged over batches."""

    d_x: float = 0.0
    d_w: float = 0.0
    d_o: float = 0.0
    x_norm: float = 0.0
    w_norm: float = 0.0
    gw_norm: float = 0.0
    x_amax: float = 0.0
    w_amax: float = 0.0
    x_ms: float = 0.0
    """Mean square of X (0 for one-hot embedding inputs)."""
    w_ms: float = 0.0
    g_ms: float = 0.0
    batches: int = 0


def _pow2e(mean_square: float) -> float:
    """2^(2e) with e = floor(log2 RMS): the squared binary magnitude; 0 for a zero tensor."""
    if mean_square <= 0:
        return 0.0
    e = math.floor(0.5 * math.log2(mean_square))
    return 2.0 ** (2 * e)


def forward_error(st: OpStats, p: str) -> float:
    if p == "fp32":
        return 0.0
    if p in INTEGER:
        s_x, s_w = st.x_amax / qmax(p), st.w_amax / qmax(p)
        return (st.w_norm * s_x**2 * st.d_x + st.x_norm * s_w**2 * st.d_w) / 6
    r = 2.0 ** (-2 * round_off_k(p))
    return r * (st.w_norm * st.d_x * _pow2e(st.x_ms) + st.x_norm * st.d_w * _pow2e(st.w_ms)) / 6


def gradient_format(kind: str, p: str, backward_precision: str) -> str:
    """The format an op of `kind` at `p` multiplies its output gradient in (runtime/qfunctions.py)."""
    if p in ("fp32", "tf32", "bf16", "fp16"):
        return p
    if fp8_grads(kind, p, backward_precision):
        return f"fp8_{GRAD_FP8}"
    return FP8_BACKWARD_FALLBACK if backward_precision == "fp8" else backward_precision


def backward_error(st: OpStats, p: str, backward_precision: str, kind: str = "linear") -> float:
    if p == "fp32":
        return 0.0
    k_g = round_off_k(gradient_format(kind, p, backward_precision))
    grad_term = st.x_norm * st.d_o * _pow2e(st.g_ms) * 2.0 ** (-2 * k_g)
    if p in INTEGER:
        saved_term = st.gw_norm * (st.x_amax / qmax(p)) ** 2 * st.d_x
    else:
        saved_term = st.gw_norm * st.d_x * _pow2e(st.x_ms) * 2.0 ** (-2 * round_off_k(p))
    return (saved_term + grad_term) / 6


def surrogate_stats(node: OpNode) -> OpStats:
    """Unit-RMS Gaussian operands of the op's shapes (for ops with no module to hook)."""
    d_x = math.prod(node.input_shapes[0]) if node.input_shapes else 1
    d_w = math.prod(node.weight_shape) if node.weight_shape else (
        math.prod(node.input_shapes[1]) if len(node.input_shapes) > 1 else d_x
    )
    amax = lambda n: math.sqrt(2 * math.log(max(n, 2)))  # noqa: E731
    return OpStats(
        d_x=d_x, d_w=d_w, d_o=node.output_numel, x_norm=math.sqrt(d_x), w_norm=math.sqrt(d_w),
        gw_norm=math.sqrt(d_w), x_amax=amax(d_x), w_amax=amax(d_w), x_ms=1.0, w_ms=1.0, g_ms=1.0, batches=1,
    )


def _accumulate(st: OpStats, **values: float) -> None:
    for k, v in values.items():
        setattr(st, k, getattr(st, k) + float(v))


def _tensor_stats(t: torch.Tensor) -> tuple[float, float, float]:
    """(Frobenius norm, absmax, mean square) of a float tensor."""
    t = t.detach().float()
    ms = float((t * t).mean().item()) if t.numel() else 0.0
    return math.sqrt(ms * t.numel()), float(t.abs().max().item()) if t.numel() else 0.0, ms


class _Collector:
    """Forward hooks on each selectable op's module; output- and operand-gradient hooks."""

    def __init__(self, model: nn.Module, names: Sequence[str]):
        self.model = model
        self.stats = {n: OpStats() for n in names}
        self.seen: set[str] = set()
        self.handles = [model.get_submodule(n).register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name: str):
        def hook(mod, args, out):
            if name in self.seen or not args:  # a module called twice: its first call is the op
                return
            self.seen.add(name)
            st, x = self.stats[name], args[0]
            w = getattr(mod, "weight", None)
            if not isinstance(w, torch.Tensor):
                w = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
            if w is None:
                raise ModelError(f"{name}: selectable op has neither a .weight nor a second operand to measure")
            if isinstance(mod, nn.Embedding) or not torch.is_floating_point(x):
                n_idx = x.numel()
                _accumulate(st, d_x=n_idx, x_norm=math.sqrt(n_idx))  # one-hot rows: exact, s_x = 0
            else:
                xn, xa, xm = _tensor_stats(x)
                _accumulate(st, d_x=x.numel(), x_norm=xn, x_amax=xa, x_ms=xm)
            wn, wa, wm = _tensor_stats(w)
            _accumulate(st, d_w=w.numel(), w_norm=wn, w_amax=wa, w_ms=wm, d_o=out.numel(), batches=1)
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda g: _accumulate(st, g_ms=_tensor_stats(g)[2]))
            if w is not getattr(mod, "weight", None) and w.requires_grad:
                w.register_hook(lambda g: _accumulate(st, gw_norm=_tensor_stats(g)[0]))

        return hook

    def after_backward(self) -> None:
        for name, st in self.stats.items():
            w = getattr(self.model.get_submodule(name), "weight", None)
            if isinstance(w, torch.Tensor) and w.grad is not None:
                _accumulate(st, gw_norm=float(w.grad.detach().float().norm().item()))
        self.seen.clear()

    def close(self) -> dict[str, OpStats]:
        for h in self.handles:
            h.remove()
        out = {}
        for name, st in self.stats.items():
            b = max(st.batches, 1)
            out[name] = OpStats(**{k: v / b for k, v in vars(st).items() if k != "batches"}, batches=st.batches)
        return out


def collect_stats(
    module: nn.Module, names: Sequence[str], calibration_batches: Iterable, loss_fn: Callable
) -> dict[str, OpStats]:
    """Run the batches forward and backward at FP32 on a copy of `module`; return op statistics."""
    model = copy.deepcopy(module).float().train()
    if any(p.device.type == "meta" for p in model.parameters()):
        raise ModelError("the model's parameters are on the meta device; build it on a real device for GVAR")
    col = _Collector(model, names)
    n_batches = 0
    try:
        for batch in calibration_batches:
            inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
            inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
            model.zero_grad(set_to_none=True)
            loss = loss_fn(model(*inputs), batch)
            loss.backward()
            col.after_backward()
            n_batches += 1
    finally:
        stats = col.close()
    if n_batches == 0:
        raise SpecError("calibration_batches: got no batches; give at least one (inputs, targets) batch")
    return stats


def gvar_indicator(
    module: nn.Module,
    graph: OpGraph,
    calibration_batches: Iterable,
    loss_fn: Callable,
    precisions: Iterable[str],
    *,
    backward_precision: str = "bf16",
    gamma: float = GAMMA,
) -> Sensitivity:
    """ω[op][p] from QSync's bi-directional indicator (module docstring), depth from `graph`.

    `calibration_batches`: (inputs, targets) pairs, inputs a tensor or a tuple of them;
    `loss_fn(output, batch)` returns a scalar (the zoo's `ModelEntry.loss_fn` fits).
    """
    ps = check_precisions(precisions)
    if backward_precision not in ("bf16", "fp16", "fp32", "fp8"):
        raise SpecError(f"runtime.backward_precision: got {backward_precision!r}; use bf16, fp16, fp32 or fp8")
    hooked, surrogate = [], []
    for node in graph.selectable:
        try:
            module.get_submodule(node.name)
            hooked.append(node.name)
        except AttributeError:
            surrogate.append(node.name)
    stats = collect_stats(module, hooked, calibration_batches, loss_fn)
    stats.update({n: surrogate_stats(graph.node(n)) for n in surrogate})
    never = [n for n in hooked if stats[n].batches == 0]
    if never:
        raise ModelError(
            f"ops {never[:3]} never ran during calibration; the graph does not match the module "
            "(trace the same module you pass here)"
        )
    loading = depth_loading(graph, gamma)
    raw = {}
    for node in graph.selectable:
        st, (fw, bw) = stats[node.name], loading[node.name]
        raw[node.name] = {p: fw * forward_error(st, p) + bw * backward_error(st, p, backward_precision, node.kind)
                          for p in ps}
    omega, scale, ref = normalise(raw, ps)
    notes = [f"{len(hooked)} ops measured, backward precision {backward_precision}, γ = {gamma}"]
    if surrogate:
        notes.append(f"no module to hook, unit-Gaussian surrogate statistics: {', '.join(surrogate)}")
    return Sensitivity(omega, "gvar", tuple(notes), scale, ref)
