"""tiles.yaml: the CUDA tile shapes per architecture and the quantize launch shape, read without torch.

The planner's dispatch table (kernels/dispatch.py) asks which architectures have templated GEMMs; the kernel specs
(kernels/spec.py) build from the same table.
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

TILES_PATH = Path(__file__).with_name("tiles.yaml")


@functools.lru_cache(maxsize=None)
def tile_table() -> dict:
    """The parsed tiles.yaml (quantize launch shape and per-arch GEMM tiles)."""
    with open(TILES_PATH) as f:
        return yaml.safe_load(f) or {}


def cuda_archs() -> tuple[str, ...]:
    """Architectures that have a tile entry, oldest first."""
    return tuple(sorted(tile_table()["archs"], key=lambda a: int(a.split("_")[1])))
