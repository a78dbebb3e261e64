"""Kernel parameter sets: what a rendered kernel module is specialised for.

A spec is plain, frozen data; its `name` carries every parameter in readable form so that a
cache directory listing says what each artefact is. CUDA tile shapes come from tiles.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from qsync_opt.errors import SpecError
from qsync_opt.kernels.dtypes import FP8, OUT_DTYPES, TORCH_DTYPE, check_names
from qsync_opt.kernels.tiles import TILES_PATH, cuda_archs, tile_table  # noqa: F401 (re-exported)

GEMM_KINDS = ("int8", "int4", "fp8")


@dataclass(frozen=True)
class CpuSpec:
    """One CPU extension: every CPU op, instantiated for these dtypes and constants."""

    in_dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")
    """Floating dtypes the absmax/quantize kernels accept."""
    out_dtypes: tuple[str, ...] = OUT_DTYPES
    """Output dtypes of the dequantising epilogue."""
    grain: int = 32768
    """Elements per parallel task (at::parallel_for grain)."""
    linear_rows: int = 0
    """Rows per int8_linear block (GEMM then epilogue while the block is in cache); 0 = one block."""
    march: str = "native"
    """Value of -march; 'native' puts the host's ISA flags into the cache key."""

    def __post_init__(self):
        object.__setattr__(self, "in_dtypes", check_names(self.in_dtypes, tuple(TORCH_DTYPE), "CpuSpec.in_dtypes"))
        object.__setattr__(self, "out_dtypes", check_names(self.out_dtypes, OUT_DTYPES, "CpuSpec.out_dtypes"))
        if not isinstance(self.grain, int) or self.grain < 1:
            raise SpecError(f"CpuSpec.grain: {self.grain!r} is not a positive int; use e.g. 32768")
        if not isinstance(self.linear_rows, int) or self.linear_rows < 0:
            raise SpecError(f"CpuSpec.linear_rows: {self.linear_rows!r}; use 0 (one block) or a positive row count")
        if not self.march.replace("-", "").replace("_", "").isalnum():
            raise SpecError(f"CpuSpec.march: {self.march!r} is not a -march value; use 'native' or e.g. 'x86-64-v3'")

    @property
    def target(self) -> str:
        return "cpu"

    @property
    def name(self) -> str:
        march = self.march.replace("-", "")
        return (f"qsync_cpu_in_{'_'.join(self.in_dtypes)}_out_{'_'.join(self.out_dtypes)}"
                f"_g{self.grain}_r{self.linear_rows}_{march}")


@dataclass(frozen=True)
class GemmTile:
    kind: str
    block_m: int
    block_n: int
    block_k: int
    warps_m: int
    warps_n: int
    instr: tuple[int, int, int]

    @property
    def label(self) -> str:
        return f"{self.kind}_{self.block_m}x{self.block_n}x{self.block_k}"


def _tile(arch: str, kind: str, raw: dict) -> GemmTile:
    t = GemmTile(kind=kind, instr=tuple(raw["instr"]), **{k: int(raw[k]) for k in
                 ("block_m", "block_n", "block_k", "warps_m", "warps_n")})
    im, inn, ik = t.instr
    if (t.block_m % (t.warps_m * im) or t.block_n % (t.warps_n * inn) or t.block_k % ik
            or t.block_k % (32 if kind == "fp8" else 16)):
        raise SpecError(f"tiles.yaml: archs.{arch}.{kind} = {raw} does not divide into warps x {t.instr} "
                        "instructions; block_m must be a multiple of warps_m*m, block_n of warps_n*n, block_k of k")
    return t


@dataclass(frozen=True)
class CudaSpec:
    """One CUDA source: quantize/dequantize kernels plus every GEMM kind the arch supports."""

    arch: str = "sm_80"
    """Target architecture, a key of tiles.yaml's archs."""
    in_dtype: str = "bf16"
    """Floating dtype the quantize kernels read and the dequantize kernel writes."""
    out_dtype: str = "fp32"
    """Output dtype of the GEMM's dequantising epilogue."""
    granularity: Literal["tensor", "channel"] = "channel"
    """Weight-scale granularity compiled into the GEMM epilogue (activations are per tensor)."""
    fp8_format: Literal["e4m3", "e5m2"] = "e4m3"
    """Operand format of the fp8 GEMM (sm_89+)."""
    tiles: tuple[GemmTile, ...] = field(default=(), compare=False)

    def __post_init__(self):
        archs = cuda_archs()
        if self.arch not in archs:
            raise SpecError(f"CudaSpec.arch: {self.arch!r} has no entry in tiles.yaml; known: {', '.join(archs)}")
        check_names((self.in_dtype,), tuple(TORCH_DTYPE), "CudaSpec.in_dtype")
        check_names((self.out_dtype,), OUT_DTYPES, "CudaSpec.out_dtype")
        if self.granularity not in ("tensor", "channel"):
            raise SpecError(f"CudaSpec.granularity: {self.granularity!r}; use 'tensor' or 'channel'")
        if self.fp8_format not in FP8:
            raise SpecError(f"CudaSpec.fp8_format: {self.fp8_format!r}; use one of {', '.join(FP8)}")
        raw = tile_table()["archs"][self.arch]
        unknown = set(raw) - set(GEMM_KINDS)
        if unknown:
            raise SpecError(f"tiles.yaml: archs.{self.arch} has unknown GEMM kinds {sorted(unknown)}; "
                            f"known: {', '.join(GEMM_KINDS)}")
        object.__setattr__(self, "tiles", tuple(_tile(self.arch, k, raw[k]) for k in GEMM_KINDS if k in raw))

    @property
    def target(self) -> str:
        return self.arch

    @property
    def sm(self) -> int:
        return int(self.arch.split("_")[1])

    def tile(self, kind: str) -> GemmTile | None:
        return next((t for t in self.tiles if t.kind == kind), None)

    @property
    def name(self) -> str:
        gemms = "_".join(t.label for t in self.tiles)
        fp8 = f"_{self.fp8_format}" if self.tile("fp8") else ""
        return f"qsync_{self.arch.replace('_', '')}_in_{self.in_dtype}_out_{self.out_dtype}_{self.granularity}_{gemms}{fp8}"
