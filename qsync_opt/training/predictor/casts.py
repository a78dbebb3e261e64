"""Cast costs: QSync's linear model t = a·n + b per (source, destination) format.

Where two adjacent operators run at different precisions the runtime converts the activation
on the way forward and the gradient on the way back; low-precision operators also convert
their FP32 master weight every iteration and quantise their own input. All of these are
memory-bound elementwise kernels, so for a catalog device

    a = bytes moved per element / (bandwidth · bandwidth_efficiency)
        (read the source, write the destination; a cast INTO an integer or fp8 format first
         finds the tensor's absmax, one more read of the source)
    b = launch overhead (two launches when there is an absmax pass).

For the T4 the fits QSync published from measurement are used as they are (QSync, IPDPS'24,
and its repository's cost-mapping script), int4 taking int8's (same absmax/quantise kernels);
pairs they did not measure fall back to the bandwidth model.

Activation formats: an operator at fp32/tf32 exchanges fp32 tensors, one at bf16/fp16 its
own format; integer and fp8 operators quantise their input themselves (inside their own
cost) and write their output dequantised in the GEMM epilogue, in the runtime's backward
precision. So the tensor on an edge is always a float, and edges between two low-precision
operators cost nothing, as the planner's contract requires. That is the "edge" boundary
(QSync); with the "fp32" boundary (this project's runtime) every op casts its own input and
output and edges cost nothing at all (followers.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from qsync_opt.errors import SpecError
from qsync_opt.hardware.device import DeviceSpec
from qsync_opt.precision import BITS, INTEGER, PRECISIONS

#: Formats that need a per-tensor scale (absmax pass) when a tensor is cast into them.
SCALED = frozenset(INTEGER | {"fp8_e4m3", "fp8_e5m2"})
#: Formats whose tensors live in memory as 32-bit floats.
FP32_STORAGE = frozenset({"fp32", "tf32"})

#: QSync's measured T4 fits (ms per element, ms fixed), keyed by (source, destination).
T4_PUBLISHED: dict[tuple[str, str], tuple[float, float]] = {
    ("fp32", "fp16"): (2.88e-8, 1.0e-3),
    ("fp16", "fp32"): (2.88e-8, 1.0e-3),
    ("fp16", "int8"): (1.29e-7, 4.6e-4),
    ("fp32", "int8"): (1.42e-7, 1.22e-2),
    ("int8", "fp16"): (2.62e-8, 4.2e-3),
    ("int8", "fp32"): (2.73e-8, -2.5e-3),
}
PUBLISHED_FITS: dict[str, dict[tuple[str, str], tuple[float, float]]] = {"T4": T4_PUBLISHED}


@dataclass(frozen=True)
class CastFit:
    """t(n) = a_ms·n + b_ms, clamped at 0 (a published fit may have a negative intercept)."""

    a_ms: float
    b_ms: float
    source: str
    """'published:<device>' or 'bandwidth'."""

    def ms(self, n_elements: float) -> float:
        if n_elements <= 0:
            return 0.0
        return max(0.0, self.a_ms * n_elements + self.b_ms)


def storage_format(precision: str) -> str:
    """The format a tensor is kept in: fp32 for tf32, the precision itself otherwise."""
    return "fp32" if precision in FP32_STORAGE else precision


def cast_fit(src: str, dst: str, device: DeviceSpec) -> CastFit:
    """The linear model for converting a tensor from `src` to `dst` on `device`."""
    for where, p in (("src", src), ("dst", dst)):
        if p not in PRECISIONS:
            raise SpecError(f"cast {where}: unknown precision {p!r}; known: {', '.join(PRECISIONS)}")
    s, d = storage_format(src), storage_format(dst)
    if s == d:
        return CastFit(0.0, 0.0, "none")
    fits = PUBLISHED_FITS.get(device.name, {})
    # int4 runs through the same absmax/quantise kernels as int8 (codes kept in int8).
    published = fits.get((s, d)) or fits.get((s.replace("int4", "int8"), d.replace("int4", "int8")))
    if published is not None:
        return CastFit(published[0], published[1], f"published:{device.name}")
    absmax = d in SCALED
    per_elem = BITS[s] / 8 + BITS[d] / 8 + (BITS[s] / 8 if absmax else 0.0)
    bytes_per_ms = device.bandwidth_gbs * 1e9 * device.bandwidth_efficiency / 1e3
    launches = 2 if absmax else 1
    return CastFit(per_elem / bytes_per_ms, launches * device.launch_overhead_us / 1e3, "bandwidth")


def cast_ms(n_elements: float, src: str, dst: str, device: DeviceSpec) -> float:
    """Time to convert `n_elements` from `src` to `dst`; 0 when both are stored alike."""
    return cast_fit(src, dst, device).ms(n_elements)


def resolve_backward_precision(requested: str, device: DeviceSpec) -> str:
    """The format quantized ops' backward runs in on `device` (the 16-bit format or fp32 of
    DeviceSpec.backward_format; under 'fp8', what the ops without fp8 gradients run)."""
    fmt = device.backward_format(requested)
    return device.backward_format("bf16") if fmt == "fp8" else fmt


def activation_format(precision: str, backward_precision: str) -> str:
    """Format of the activation an operator at `precision` writes (and of the gradient it
    sends back): fp32 for fp32/tf32, bf16/fp16 for themselves, and the backward precision
    for integer and fp8 operators (output dequantised in the epilogue, backward in that format)."""
    if precision in FP32_STORAGE:
        return "fp32"
    if precision in ("bf16", "fp16"):
        return precision
    return storage_format(backward_precision)


def edge_cast_parts(
    n_elements: float,
    pa: str,
    pb: str,
    device: DeviceSpec,
    backward_precision: str = "bf16",
    boundary: str = "edge",
) -> tuple[float, float]:
    """(forward, backward) cast time on an edge a -> b whose ends run at pa and pb.

    Forward: a's activation format to b's. Backward: b's gradient format back to a's.
    With boundary 'fp32' every op casts its own input and output, so edges cost nothing.
    """
    if pa == pb or boundary == "fp32":
        return 0.0, 0.0
    bwd = resolve_backward_precision(backward_precision, device)
    fa, fb = activation_format(pa, bwd), activation_format(pb, bwd)
    return cast_ms(n_elements, fa, fb, device), cast_ms(n_elements, fb, fa, device)


def edge_cast_ms(
    n_elements: float,
    pa: str,
    pb: str,
    device: DeviceSpec,
    backward_precision: str = "bf16",
    boundary: str = "edge",
) -> float:
    """Forward activation cast plus backward gradient cast on an edge; 0 when pa == pb."""
    f, b = edge_cast_parts(n_elements, pa, pb, device, backward_precision, boundary)
    return f + b
