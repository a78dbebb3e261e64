"""What the co-located profilers' collectives wrote, read back without torch (allreduce_profile measures them).

`qsync-opt profile`'s parent reads these files once its measuring processes exit; it imports no torch, so that
those processes start without waiting for it (colocate.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from qsync_opt.training.predictor.measuring import fit_line, lockstep_median_ms


def fit(times: dict[int, float]) -> dict[str, float]:
    """α (ms) + β (ms per byte) of an all-reduce, least squares over {bytes: ms}."""
    a, b = fit_line(list(times), list(times.values()))
    return {"alpha_ms": b, "beta_ms_per_byte": a}


class Collectives(NamedTuple):
    """What `collectives` measured, None where it was not measured."""

    allreduce_fit: dict | None
    """α (ms) and β (ms per byte) of the gloo all-reduce."""
    ddp_step_ms: float | None
    """The slowest rank's fp32 DDP step (ms), median over steps."""


def read_results(out_dir: Path, world: int) -> Collectives:
    """What `collectives` wrote to `out_dir`; the DDP step is read as `train` reads its iterations:
    per step the slowest rank, then the median over steps."""
    ar = out_dir / "allreduce.json"
    fitted = fit({int(k): v for k, v in json.loads(ar.read_text()).items()}) if ar.exists() else None
    steps = [out_dir / f"ddp.{r}" for r in range(world)]
    ddp = lockstep_median_ms([json.loads(f.read_text()) for f in steps]) if all(f.exists() for f in steps) else None
    return Collectives(fitted, ddp)


