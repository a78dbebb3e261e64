"""What runs where: the one decision, per target and precision, of which GEMM implementation executes.

kernels/ops.py calls `gemm_impl` with the target of the tensor it is given and runs the
implementation it names; the planner's `implementation_table` calls the very same function
with the target of each catalog device (hardware.device.catalog_table). So the table cannot say something dispatch does not do.

Implementations are of three kinds:
  templated  a kernel rendered from kernels/templates (CPU: fused int8 epilogue over oneDNN;
             CUDA: WMMA int8/int4 and mma.sync fp8 GEMMs from tiles.yaml)
  library    a torch op (cuBLAS/cuBLASLt/oneDNN matmul, torch._int_mm, torch._scaled_mm)
  emulation  another format's GEMM on this format's values: int4 as ±7 codes through the int8
             path, fp8 as an fp32 GEMM on fp8-rounded values, tf32 as fp32 where no TF32 units
Each names the catalog rate (`rate`) that prices it, so an emulated format is never priced at
its own tensor-core peak.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from qsync_opt.errors import SpecError
from qsync_opt.precision import PEAK_KEY, PRECISIONS

if TYPE_CHECKING:
    import torch

Kind = Literal["templated", "library", "emulation"]
KERNELS = ("auto", "templated", "torch")

#: GEMM library ops ops.py can call, by name.
INT_MM = "torch._int_mm"
SCALED_MM = "torch._scaled_mm"
#: Under kernels='auto', which int8 GEMM runs on CUDA: cuBLASLt through torch._int_mm ('library')
#: or the templated WMMA kernel ('templated'). cuBLASLt is vendor-tuned (multi-stage pipelines)
#: and the WMMA kernel is not; benchmarks/gpu_check.py measures both on the GPU it runs on and
#: prints the ratio, which is what this choice must follow.
CUDA_INT8_AUTO: Literal["library", "templated"] = "library"
#: fp8 formats cuBLASLt multiplies with both operands in that format (e5m2 x e5m2 is refused).
SCALED_MM_FORMATS = ("e4m3",)
#: First compute capability with fp8 tensor cores (Ada, sm_89).
FP8_SM = 89
#: First compute capability with TF32 tensor cores (Ampere, sm_80).
TF32_SM = 80


@dataclass(frozen=True)
class Target:
    """Where a GEMM runs: the CPU, or a CUDA device of compute capability `sm` (None: unknown)."""

    kind: Literal["cpu", "cuda"]
    sm: int | None = None

    @classmethod
    def of_device(cls, device: torch.device) -> "Target":
        if device.type == "cuda":
            import torch  # import cost: the planner reads this module's table without torch (serving, rollout)

            major, minor = torch.cuda.get_device_capability(device)
            return cls("cuda", major * 10 + minor)
        return cls("cpu")

    @classmethod
    def of_tensor(cls, t: torch.Tensor) -> "Target":
        return cls.of_device(t.device)

    @classmethod
    def of_device_spec(cls, device) -> "Target":
        """A catalog DeviceSpec's target (kind 'cpu' -> cpu; a GPU -> CUDA at its `sm`)."""
        return cls("cpu") if device.kind == "cpu" else cls("cuda", device.sm)

    @property
    def label(self) -> str:
        return "cpu" if self.kind == "cpu" else f"sm_{self.sm}" if self.sm else "cuda"


@dataclass(frozen=True)
class Impl:
    """One GEMM implementation: what it is (`op`), its kind, and the catalog rate that prices it."""

    kind: Kind
    op: str
    """'torch.matmul', 'torch._int_mm', 'torch._scaled_mm', 'qsync.cpu.int8_linear',
    'qsync.cuda.int8_wmma', 'qsync.cuda.int4_wmma', 'qsync.cuda.fp8_mma', or for emulation the
    op that really runs, e.g. 'int8 path on ±7 codes'."""
    rate: str
    """catalog peak key (hardware.device.PeakKey) of the arithmetic that actually runs."""
    via: str | None = None
    """For emulation: the precision whose path runs (int4 -> 'int8', fp8 -> 'fp32')."""
    note: str = ""

    @property
    def label(self) -> str:
        return f"{self.kind}: {self.op}"


def cuda_arch(sm: int | None) -> str | None:
    """The newest tiles.yaml arch not newer than `sm` (its code runs there), or None."""
    if sm is None:
        return None
    from qsync_opt.kernels.tiles import cuda_archs  # import cost: tiles.yaml is read once a CUDA device asks

    fit = [a for a in cuda_archs() if int(a.split("_")[1]) <= sm]
    return fit[-1] if fit else None


def cuda_gemm_kinds(sm: int | None) -> tuple[str, ...]:
    """GEMM kinds ('int8', 'int4', 'fp8') the templated CUDA kernels have for this capability."""
    arch = cuda_arch(sm)
    if arch is None:
        return ()
    from qsync_opt.kernels.tiles import tile_table  # import cost: tiles.yaml is read once a CUDA device asks

    return tuple(tile_table()["archs"][arch])


def _check_kernels(kernels: str) -> None:
    if kernels not in KERNELS:
        raise SpecError(f"kernels: unknown value {kernels!r}; use one of {', '.join(KERNELS)}")


def _float_impl(target: Target, precision: str) -> Impl:
    if precision == "tf32":
        if target.kind == "cuda" and (target.sm or 0) >= TF32_SM:
            return Impl("library", "torch.matmul", "tf32", note="TF32 tensor cores scoped to the op")
        return Impl("emulation", "torch.matmul", "fp32", via="fp32", note="no TF32 units: runs as fp32")
    return Impl("library", "torch.matmul", precision)


def _int8_impl(target: Target, kernels: str) -> Impl:
    if target.kind == "cpu":
        if kernels == "torch":
            return Impl("library", INT_MM, "int8", note="oneDNN; epilogue in torch")
        return Impl("templated", "qsync.cpu.int8_linear", "int8", note="oneDNN int8 GEMM, fused epilogue")
    has = "int8" in cuda_gemm_kinds(target.sm)
    if kernels == "templated" and not has:
        raise SpecError(f"kernels='templated': no templated int8 GEMM for {target.label} (tiles.yaml starts at "
                        "sm_75); use kernels='auto' or 'torch'")
    if kernels == "templated" or (kernels == "auto" and has and CUDA_INT8_AUTO == "templated"):
        return Impl("templated", "qsync.cuda.int8_wmma", "int8")
    return Impl("library", INT_MM, "int8", note="cuBLASLt; epilogue in torch")


def _int4_impl(target: Target, kernels: str) -> Impl:
    if target.kind == "cuda" and kernels != "torch" and "int4" in cuda_gemm_kinds(target.sm):
        return Impl("templated", "qsync.cuda.int4_wmma", "int4", note="operands packed two per byte first")
    base = _int8_impl(target, kernels)
    return Impl("emulation", f"{base.op} on ±7 codes", base.rate, via="int8",
                note="clamping is the quantize kernel's qmax (7), no extra pass")


def _fp8_impl(target: Target, kernels: str, fmt: str) -> Impl:
    fast = target.kind == "cuda" and (target.sm or 0) >= FP8_SM
    if fast and kernels != "templated" and fmt in SCALED_MM_FORMATS:
        return Impl("library", SCALED_MM, "fp8", note="cuBLASLt fp8; per-tensor scales in its epilogue, bias in torch")
    if fast and kernels != "torch" and "fp8" in cuda_gemm_kinds(target.sm):
        return Impl("templated", "qsync.cuda.fp8_mma", "fp8")
    if kernels == "templated" and target.kind == "cuda":
        raise SpecError(f"kernels='templated': no templated fp8 GEMM for {target.label} (needs sm_{FP8_SM}+); "
                        "use kernels='auto' or 'torch'")
    return Impl("emulation", "torch.matmul fp32 on fp8-rounded values", "fp32", via="fp32",
                note="fp8 storage, fp32 arithmetic")


@functools.lru_cache(maxsize=1024)
def gemm_impl(target: Target, precision: str, kernels: str = "auto") -> Impl:
    """The forward GEMM that runs `precision` on `target` under `kernels` (the runtime's setting).

    kernels: 'auto' (templated where it exists and is the faster choice, else a torch op),
    'templated' (insist on the templated kernel where one exists for the format; error where a
    device has none for int8/fp8), 'torch' (torch ops only). The CPU build has one templated GEMM
    (int8, also used by int4); whether it builds is checked when it runs (auto then falls back).
    """
    _check_kernels(kernels)
    if precision in ("fp32", "tf32", "bf16", "fp16"):
        return _float_impl(target, precision)
    if precision == "int8":
        return _int8_impl(target, kernels)
    if precision == "int4":
        return _int4_impl(target, kernels)
    if precision in ("fp8_e4m3", "fp8_e5m2"):
        return _fp8_impl(target, kernels, precision.split("_")[1])
    raise SpecError(f"precision: unknown {precision!r}")


#: The fp8 format of output gradients when fp8 operators run their backward in fp8 (`backward_precision: fp8`):
#: e5m2's range, as in torchao's float8 training.
GRAD_FP8 = "e5m2"
#: Under `backward_precision: fp8`, an fp8 linear's forward GEMM on torch._scaled_mm accumulates fast (use_fast_accum:
#: on Hopper, no periodic promotion of the tensor cores' accumulator to fp32) and its two gradient GEMMs do not:
#: torchao's Float8LinearConfig defaults. Its error stays within reference.fp8_gemm_tolerance's library bound, which
#: already models that accumulator; the templated and emulated GEMMs accumulate in fp32 either way.
FP8_TRAINING_FAST_ACCUM = True
#: Impl.op of torch._scaled_mm with use_fast_accum: an implementation of its own, timed and calibrated apart.
SCALED_MM_FAST = "torch._scaled_mm (use_fast_accum)"


def fp8_mixed_impl(target: Target, kernels: str = "auto") -> Impl:
    """The GEMM of an e5m2 operand with an e4m3 one (a gradient times saved e4m3 codes): cuBLASLt's torch._scaled_mm
    where the device has fp8 tensor cores, under any `kernels` setting (the templated kernels take one format for
    both operands), else an fp32 GEMM on the fp8 values."""
    _check_kernels(kernels)
    if target.kind == "cuda" and (target.sm or 0) >= FP8_SM:
        return Impl("library", SCALED_MM, "fp8", note="cuBLASLt fp8, e5m2 x e4m3; scales in its epilogue")
    return Impl("emulation", "torch.matmul fp32 on fp8-rounded values", "fp32", via="fp32",
                note="fp8 storage, fp32 arithmetic")


def fp8_training_forward_impl(target: Target, precision: str, kernels: str = "auto") -> Impl:
    """The forward GEMM of an fp8 linear under `backward_precision: fp8`: gemm_impl's, accumulating fast where that
    is torch._scaled_mm (FP8_TRAINING_FAST_ACCUM)."""
    impl = gemm_impl(target, precision, kernels)
    if FP8_TRAINING_FAST_ACCUM and impl.op == SCALED_MM:
        return Impl(impl.kind, SCALED_MM_FAST, impl.rate, note=f"{impl.note}; fast accumulation")
    return impl


def fp8_backward_impl(target: Target, precision: str, kernels: str = "auto") -> Impl:
    """The two backward GEMMs of an fp8 linear under `backward_precision: fp8`: the e5m2 output gradient times the
    saved weight codes (grad_input) and times the saved input codes (grad_weight), both in `precision`'s format."""
    fmt = precision.split("_")[1]
    if fmt == GRAD_FP8:
        return gemm_impl(target, precision, kernels)
    return fp8_mixed_impl(target, kernels)


def kernel_choices(target: Target, precision: str, kernels: str = "auto") -> tuple[str, ...]:
    """The `kernels` settings that run different code for `precision` on `target`: what a profile on that device
    times against each other (training/predictor/measured_dispatch.py) before the runtime is told the faster.

    Under kernels='auto' on the CPU, int8 and int4: 'templated' (the rendered int8 GEMM with its fused epilogue;
    convolutions as im2col and that GEMM; the templated quantize) and 'torch' (torch._int_mm or its exact fp32
    slices, oneDNN's int8 or fp32-on-codes convolution, torch's elementwise ops). On CUDA: the templated GEMM of
    that format where tiles.yaml has one for the device, and the library op. A pinned setting ('templated' or
    'torch') is the user's choice and is not raced; float formats have one implementation."""
    _check_kernels(kernels)
    if kernels != "auto":
        return (kernels,)
    if precision in ("int8", "int4"):
        if target.kind == "cpu" or "int8" in cuda_gemm_kinds(target.sm):
            return ("templated", "torch")
        return ("torch",)
    if precision in ("fp8_e4m3", "fp8_e5m2"):
        fast = target.kind == "cuda" and (target.sm or 0) >= FP8_SM
        if fast and "fp8" in cuda_gemm_kinds(target.sm) and precision.split("_")[1] in SCALED_MM_FORMATS:
            return ("templated", "torch")
    return ("auto",)


def elementwise_impl(target: Target, kernels: str = "auto") -> Impl:
    """quantize / dequantize / absmax: the templated kernels (CPU; CUDA sm_75+), else torch ops."""
    _check_kernels(kernels)
    if kernels != "torch" and (target.kind == "cpu" or cuda_arch(target.sm) is not None):
        return Impl("templated", f"qsync.{target.kind}.quantize", "fp32")
    return Impl("library", "torch elementwise ops", "fp32")


def storage_bits(precision: str) -> int:
    """Bits per element of what the runtime keeps for a tensor at `precision` (codes saved for
    backward, weight copies): the dtypes the kernel ops return. int4 codes live in int8 tensors
    (quantize_symmetric returns int8 for every bit width), fp8 in torch's float8 dtypes."""
    import torch  # import cost: as in Target.of_device

    from qsync_opt.kernels.dtypes import FP8, TORCH_DTYPE  # import cost: torch

    if precision in ("int8", "int4"):
        dtype = torch.int8
    elif precision.startswith("fp8_"):
        dtype = FP8[precision.split("_")[1]]["torch"]
    else:
        dtype = TORCH_DTYPE.get(precision, torch.float32)
    return torch.empty((), dtype=dtype).element_size() * 8


# ---- the table the planner reads -------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One (device, precision): what runs, and whether the planner may offer it."""

    device: str
    target: str
    precision: str
    impl: Impl
    offered: bool
    why: str


def implementation(device, precision: str, kernels: str = "auto") -> Impl:
    """The implementation the runtime executes for `precision` on a DeviceSpec."""
    return gemm_impl(Target.of_device_spec(device), precision, kernels)


def offer(device, precision: str, kernels: str = "auto") -> tuple[bool, str]:
    """Whether the planner may offer `precision` on `device`, and why (not).

    Offered when the device's datasheet lists the format (catalog peak_tflops) and the
    implementation that runs is not an emulation through a wider format's arithmetic (fp8 as
    fp32, tf32 as fp32): such a format is never faster than the wider one and only loses
    accuracy. int4 emulated through the int8 path is offered where the catalog lists int4 and
    priced at the int8 rate.
    """
    try:
        impl = implementation(device, precision, kernels)
    except SpecError as e:
        return False, str(e)
    if PEAK_KEY[precision] not in device.peak_tflops:
        return False, f"{device.name} lists no {PEAK_KEY[precision]} rate"
    if impl.kind == "emulation" and impl.via == "fp32":
        return False, f"runs as {impl.op}: no faster than fp32"
    if impl.rate not in device.peak_tflops:
        return False, f"{device.name} lists no {impl.rate} rate for {impl.op}"
    return True, f"priced at the {impl.rate} rate"


def implementation_table(devices, kernels: str = "auto") -> list[Row]:
    """Rows for every (device, precision) of `devices` (hardware.device.catalog_table: the catalog's)."""
    devices = list(devices)
    rows = []
    for d in devices:
        target = Target.of_device_spec(d).label
        for p in PRECISIONS:
            try:
                impl = implementation(d, p, kernels)
            except SpecError as e:
                rows.append(Row(d.name, target, p, Impl("emulation", "none", "fp32", note=str(e)), False, str(e)))
                continue
            ok, why = offer(d, p, kernels)
            rows.append(Row(d.name, target, p, impl, ok, why))
    return rows


def format_table(rows: list[Row]) -> str:
    """A plain-text table: device, target, precision, implementation, rate, offered."""
    head = ("device", "target", "precision", "implementation", "rate", "offered")
    body = [(r.device, r.target, r.precision, r.impl.label, r.impl.rate, "yes" if r.offered else f"no ({r.why})")
            for r in rows]
    width = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, width)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in width]), *map(line, body)])
