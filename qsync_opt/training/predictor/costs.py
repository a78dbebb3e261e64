"""Roofline costs per operator and precision, for devices that are not present to profile.

One kernel's time is max(FLOPs / achieved FLOP/s, bytes / achieved bandwidth) plus its launch
overhead; forward is one kernel, backward two (input grad and weight grad).

Which GEMM runs, and so which catalog rate prices it, comes from the runtime's dispatch
(kernels/dispatch.py, through DeviceSpec.achieved_flops): int4 emulated through the int8 path
costs the int8 rate; a format dispatch would emulate through fp32 is not offered at all. The
implementation also adds what it really does around the GEMM:
  - the templated int4 kernel first packs both int8-held operands two per byte (one pass);
  - library int8 GEMMs (torch._int_mm) write a 32-bit accumulator and run the dequantising
    epilogue as torch ops (float(acc) * scale, + bias: 2 passes over it); torch._scaled_mm takes
    fp8's per-tensor scales into cuBLASLt's epilogue, so only the bias is a pass of its own
    (kernels/cuda_ops.scaled_mm); the templated kernels fuse it all.

Bytes of a selectable op at precision p (see casts.py for activation formats):
  forward   inputs and weights at the runtime's storage width (dispatch.storage_bits: int4
            codes are int8 tensors), output in p's activation format
            (fp32 for fp32/tf32, 2 bytes for bf16/fp16, and for integer/fp8 the int32
            accumulator is dequantised in the epilogue into the backward precision, so their
            output is 16-bit, not 8).
            Integer/fp8 ops also quantise their own input (absmax + quantise kernel, cast model).
  backward  runs at p for float formats and at the runtime's backward precision for integer
            and fp8 ops (QSync: FP16; on devices without it the best 16-bit format or fp32), so
            those formats differ from a 16-bit op only in forward cost. It reads the output
            gradient twice, the weight (dequantised on the fly) and the saved input (kept at
            the storage width), and writes the input gradient and an FP32 weight gradient.
  fp8 grads under backward_precision 'fp8', an fp8 linear's backward instead quantizes the fp32 output
            gradient to e5m2 (the cast model), copies it and the saved input and weight codes
            transposed (1 byte read and written each), and runs its two GEMMs on the codes at the rate
            of what dispatch.fp8_backward_impl runs (fp8 tensor cores, or fp32 where emulated), writing
            fp32 gradients with the scales applied in the GEMM; `fp8_backward_ms`. Calibrated only by a
            factor measured that way (hardware/calibration.py's `backward: fp8`), never by the factor of
            the module with its 16-bit backward. Its forward GEMM is dispatch.fp8_training_forward_impl
            (torch._scaled_mm with fast accumulation, torchao's setting), priced at its own GEMM factor.
  weight    an op below fp32/tf32 casts its FP32 master weight every iteration:
            `weight_cast_ms`, part of the op's total.
Embedding reads int64 indices and gathers only the rows it outputs.

Calibrated ops: where the device's architecture was measured at p for the op's kind (linear,
matmul and bmm as 'linear'; conv1d/conv2d as 'conv'; hardware/calibration.py), the factor is
the achieved fraction of peak of the runtime's whole module, forward and backward, with its
casts, quantisation, epilogue and backward precision inside. Such an op costs its FLOPs at
that rate (forward and backward in proportion to their FLOPs), the byte model above as the
floor of each kernel, and no separate cast, epilogue or weight-cast term. Embeddings and
every other op keep the datasheet model.

Non-selectable ops (norms, activations, adds, pools) are memory-bound kernels (their FLOPs a
roofline floor) whose element size is that of the format they run in; which format that is,
is decided in followers.py (the format of the selectable op they follow, or fp32).

`boundary` says where precision changes: 'edge' (QSync: activations travel in their
producer's format, casts on edges) or 'fp32' (this project's runtime: each op casts its fp32
input in and its output back, so those casts are in the op's own cost).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from qsync_opt.errors import SpecError
from qsync_opt.hardware.calibration import gemm_factor, op_kind
from qsync_opt.hardware.device import DeviceSpec
from qsync_opt.kernels.dispatch import (GRAD_FP8, SCALED_MM, Impl, Target, fp8_backward_impl,
                                        fp8_training_forward_impl, implementation, storage_bits)
from qsync_opt.models.graph import OpGraph, OpNode
from qsync_opt.precision import BITS, PRECISIONS, sort_high_to_low
from qsync_opt.training.predictor.casts import SCALED, activation_format, cast_ms, resolve_backward_precision, storage_format

#: Optimizer state in FP32 copies of the weights: what the step reads and writes.
OPTIMIZER_STATES: dict[str, int] = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
INDEX_BYTES = 8  # embedding indices are int64


@dataclass(frozen=True)
class OpCost:
    """Per-iteration time of one op at one precision, in ms."""

    fwd_ms: float
    """Forward kernel, plus the input quantisation of integer/fp8 ops."""
    bwd_ms: float
    weight_cast_ms: float = 0.0
    """FP32 master weight -> low-precision copy, every iteration."""

    @property
    def total_ms(self) -> float:
        return self.fwd_ms + self.bwd_ms + self.weight_cast_ms


def _bytes_per_ms(device: DeviceSpec) -> float:
    return device.bandwidth_gbs * 1e9 * device.bandwidth_efficiency / 1e3


def kernel_ms(flops: float, nbytes: float, precision: str, device: DeviceSpec, launches: int = 1,
              op_kind: str | None = None, backward: str | None = None, flops_per_s: float | None = None) -> float:
    """Roofline time of `launches` kernels doing `flops` at `precision` and moving `nbytes` (at `flops_per_s`
    when given, else at the calibrated rate of `op_kind`, and `backward`, where the device has one:
    DeviceSpec.achieved_flops)."""
    rate = flops_per_s or device.achieved_flops(precision, op_kind, backward)
    compute = flops / rate * 1e3 if flops > 0 else 0.0
    memory = nbytes / _bytes_per_ms(device) if nbytes > 0 else 0.0
    return max(compute, memory) + launches * device.launch_overhead_us / 1e3


#: elementwise passes of the unfused epilogue after a library int/fp8 GEMM (reference.epilogue):
#: float(acc) * scale, then + bias.
LIBRARY_EPILOGUE_PASSES = 2


def gemm_extras_ms(node: OpNode, p: str, device: DeviceSpec) -> float:
    """Time the runtime's implementation of p spends around its GEMM (module docstring)."""
    if p not in SCALED or node.kind == "embedding":
        return 0.0
    impl = implementation(device, p, device.kernels)
    if impl.kind == "emulation" and impl.via in SCALED:  # int4 on ±7 codes: what the int8 path does
        impl = implementation(device, impl.via, device.kernels)
    if impl.op == "qsync.cuda.int4_wmma":  # int8-held codes in, packed nibbles out, for input and weight
        return kernel_ms(0, 1.5 * (node.input_numel + node.param_count), "fp32", device, launches=2)
    if impl.kind == "library" and device.kind != "cpu":
        passes = LIBRARY_EPILOGUE_PASSES if impl.op != SCALED_MM else int(has_bias(node))
        return kernel_ms(0, 8 * node.output_numel * passes, "fp32", device, launches=passes) if passes else 0.0
    return 0.0


def has_bias(node: OpNode) -> bool:
    """Whether a GEMM-shaped op adds a bias: parameters beyond its weight's."""
    w = 1
    for d in node.weight_shape or (0,):
        w *= d
    return node.param_count > w


def gemm_rate(device: DeviceSpec, precision: str, impl) -> float:
    """FLOP/s of one GEMM run by `impl` at `precision`: its measured GEMM factor on this architecture
    (hardware/calibration.gemm_factor), else the catalog efficiency of `precision`'s rate."""
    f = gemm_factor(device, precision, impl)
    return device.peak_tflops[f.rate] * 1e12 * f.factor if f is not None else device.achieved_flops(precision)


def fp8_grads(kind: str, p: str, backward_precision: str) -> bool:
    """Whether an op of graph kind `kind` at `p` runs its backward GEMMs in fp8 (runtime/qfunctions.py: fp8 linears
    under backward_precision 'fp8')."""
    return backward_precision == "fp8" and p.startswith("fp8_") and kind == "linear"


def forward_gemm_impl(kind: str, p: str, device: DeviceSpec, backward_precision: str) -> Impl:
    """The forward GEMM an op of graph kind `kind` runs at `p` on `device`: fp8 training's (fast accumulation on
    torch._scaled_mm: dispatch.fp8_training_forward_impl) for an fp8 linear under backward_precision 'fp8', else
    what dispatch names for `p`."""
    if fp8_grads(kind, p, backward_precision):
        return fp8_training_forward_impl(Target.of_device_spec(device), p, device.kernels)
    return implementation(device, p, device.kernels)


def fp8_backward_ms(node: OpNode, p: str, device: DeviceSpec) -> float:
    """Backward of an fp8 linear whose GEMMs run in fp8 (module docstring, 'fp8 grads')."""
    impl = fp8_backward_impl(Target.of_device_spec(device), p, device.kernels)
    n_in, n_out, n_w = node.input_numel, node.output_numel, node.param_count
    quantize = cast_ms(n_out, "fp32", f"fp8_{GRAD_FP8}", device)
    transposes = kernel_ms(0, 2 * (n_out + n_in + n_w), "fp32", device, launches=3)
    rate_p = p if impl.rate == "fp8" else "fp32"
    gemms = kernel_ms(node.bwd_flops, 2 * n_out + n_in + n_w + 4 * (n_in + n_w), rate_p, device, launches=2,
                      flops_per_s=gemm_rate(device, rate_p, impl))
    return quantize + transposes + gemms  # per-tensor scales: cuBLASLt's epilogue (cuda_ops.scaled_mm), no bias


def backward_compute_precision(precision: str, backward_precision: str) -> str:
    """Float formats run their own backward; integer and fp8 ops run the runtime's."""
    return precision if precision in ("fp32", "tf32", "bf16", "fp16") else backward_precision


def selectable_cost(
    node: OpNode,
    p: str,
    device: DeviceSpec,
    backward_precision: str,
    backward: bool = True,
    boundary: str = "edge",
) -> OpCost:
    """Cost of a selectable op at precision `p` (module docstring for the byte model).

    boundary 'edge': the op reads and writes activations in its own format (casts are paid on
    edges); 'fp32': it casts its fp32 input in and its output back itself (and the gradients
    the other way), as this project's runtime does, so those casts are part of its cost.
    """
    bwd_p = resolve_backward_precision(backward_precision, device)
    store = storage_bits(p) / 8  # inputs, saved input and weight copy, as the runtime keeps them
    act = activation_format(p, bwd_p)  # the format the op works in around its GEMM
    out_fmt = "fp32" if boundary == "fp32" and p in SCALED else act  # int/fp8 epilogue writes fp32 there
    out_b, grad_b = BITS[out_fmt] / 8, BITS[act] / 8
    n_in, n_out, n_w = node.input_numel, node.output_numel, node.param_count

    in_fmt = "fp32" if boundary == "fp32" else act
    if node.kind == "embedding":
        fwd_bytes = n_in * INDEX_BYTES + n_out * store + n_out * out_b
        bwd_bytes = n_out * grad_b + n_in * INDEX_BYTES + 2 * n_out * 4 + n_w * 4  # scatter-add into a zeroed fp32 grad
        cast_in = 0.0  # indices are not cast
    else:
        fwd_bytes = n_in * store + n_w * store + n_out * out_b
        bwd_bytes = 2 * n_out * grad_b + n_w * store + n_in * grad_b + n_in * store + n_w * 4
        cast_in = cast_ms(n_in, in_fmt, p, device)  # quantisation for int/fp8; the input cast in 'fp32' mode
    kind = op_kind(node.kind)
    fp8_bwd = fp8_grads(node.kind, p, backward_precision)
    cal_bwd = "fp8" if fp8_bwd else None
    if device.calibration(p, kind, cal_bwd) is not None:  # the measured module: casts and its backward inside
        fwd = kernel_ms(node.fwd_flops, fwd_bytes, p, device, op_kind=kind, backward=cal_bwd)
        bwd = kernel_ms(node.bwd_flops, bwd_bytes, p, device, launches=2, op_kind=kind,
                        backward=cal_bwd) if backward else 0.0
        return OpCost(fwd, bwd)
    cast_out = cast_ms(n_out, out_fmt, "fp32", device) if boundary == "fp32" else 0.0
    rate = gemm_rate(device, p, forward_gemm_impl(node.kind, p, device, backward_precision)) if kind else None
    fwd = (kernel_ms(node.fwd_flops, fwd_bytes, p, device, flops_per_s=rate) + cast_in + cast_out
           + gemm_extras_ms(node, p, device))
    bwd = 0.0
    if backward and fp8_bwd:
        bwd = fp8_backward_ms(node, p, device)
    elif backward:
        bwd = kernel_ms(node.bwd_flops, bwd_bytes, backward_compute_precision(p, bwd_p), device, launches=2)
        if boundary == "fp32" and act != "fp32":  # grad_out in, grad_in and grad_weight back out
            bwd += cast_ms(n_out, "fp32", act, device)
            bwd += cast_ms(n_in, act, "fp32", device) if node.kind != "embedding" else 0.0
    wcast = cast_ms(n_w, "fp32", p, device) if n_w and storage_format(p) != "fp32" else 0.0
    return OpCost(fwd, bwd, wcast)


def fixed_cost(node: OpNode, device: DeviceSpec, backward: bool = True, elem_bytes: float = 4.0) -> OpCost:
    """A non-selectable op with `elem_bytes`-wide activations (fp32 by default): memory-bound,
    with its FLOPs as a floor; its own parameters (norm scales) stay fp32."""
    n_in, n_out, n_w = node.input_numel, node.output_numel, node.param_count
    fwd = kernel_ms(node.fwd_flops, elem_bytes * (n_in + n_out) + 4 * n_w, "fp32", device)
    bwd = 0.0
    if backward:
        launches = 2 if n_w else 1
        bwd = kernel_ms(node.bwd_flops, elem_bytes * (2 * n_in + n_out) + 8 * n_w, "fp32", device, launches)
    return OpCost(fwd, bwd)


def offered_precisions(device: DeviceSpec, allowed: Iterable[str] | None = None) -> tuple[str, ...]:
    """Precisions the planner may choose on `device`: `allowed` ∩ native formats, highest first."""
    native = device.precisions
    if allowed is None:
        return native
    allowed = tuple(allowed)
    bad = [p for p in allowed if p not in PRECISIONS]
    if bad:
        raise SpecError(f"precisions: unknown {bad}; known: {', '.join(PRECISIONS)}")
    return sort_high_to_low(p for p in allowed if p in native)


def op_costs(
    graph: OpGraph,
    device: DeviceSpec,
    *,
    backward: bool = True,
    precisions: Iterable[str] | None = None,
    backward_precision: str = "bf16",
    boundary: str = "edge",
) -> dict[str, dict[str, OpCost]]:
    """op -> precision -> OpCost for every selectable op, at the precisions the device runs."""
    if boundary not in ("edge", "fp32"):
        raise SpecError(f"boundary: got {boundary!r}; use 'edge' (QSync) or 'fp32' (this runtime)")
    offer = offered_precisions(device, precisions)
    if not offer:
        raise SpecError(
            f"precisions: none of {list(precisions or [])} runs natively on {device.name} "
            f"(it runs {list(device.precisions)}); allow at least one of those"
        )
    return {
        n.name: {p: selectable_cost(n, p, device, backward_precision, backward, boundary) for p in offer}
        for n in graph.selectable
    }


def fixed_costs(graph: OpGraph, device: DeviceSpec, *, backward: bool = True) -> dict[str, OpCost]:
    """op -> OpCost for every non-selectable op (fixed at fp32)."""
    return {n.name: fixed_cost(n, device, backward) for n in graph.fixed}


def optimizer_ms(graph: OpGraph, optimizer: str, device: DeviceSpec) -> float:
    """One optimizer step: read param, grad and states, write param and states, all FP32.

    One launch per op that holds parameters (an upper bound for fused multi-tensor steps).
    """
    if optimizer not in OPTIMIZER_STATES:
        raise SpecError(
            f"training.optimizer: {optimizer!r} is not known; use one of {', '.join(OPTIMIZER_STATES)}"
        )
    states = OPTIMIZER_STATES[optimizer]
    n_params = graph.param_count
    if n_params == 0:
        return 0.0
    nbytes = 4 * n_params * (3 + 2 * states)
    launches = sum(1 for n in graph.nodes if n.param_count)
    return kernel_ms(0, nbytes, "fp32", device, launches)
