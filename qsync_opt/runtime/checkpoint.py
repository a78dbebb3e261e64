"""Checkpoints a resumed run continues from exactly: fp32 model, optimizer, step, every RNG.

Layout under the checkpoint directory:
    step_00000005/state.pt      model (fp32 master weights, plain FQNs), optimizer, step, meta  (rank 0)
    step_00000005/rng_rank1.pt  that rank's RNG states (dropout, stochastic rounding)          (every rank)
    latest                      name of the newest complete checkpoint directory
Every file is written atomically and `latest` only moves after all ranks have written theirs,
so a kill at any moment leaves the previous checkpoint usable. Everything is stored as tensors
and plain Python values, so loading uses torch.load(weights_only=True).
"""

from __future__ import annotations

import io
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from ..errors import RuntimeSetupError
from ..io import atomic_write_bytes, atomic_write_text

LATEST = "latest"


def step_dir(root: "str | Path", step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def _save(obj, path: Path) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def rng_state() -> dict:
    """Every RNG a training step can draw from, as tensors and plain values."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.random.get_rng_state(),
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.random.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_rank_files(root, step: int, rank: int, *, model_state=None, optimizer_state=None, meta=None) -> Path:
    """Write this rank's part of checkpoint `step` (rank 0 also passes model and optimizer state)."""
    d = step_dir(root, step)
    _save(rng_state(), d / f"rng_rank{rank}.pt")
    if model_state is not None:
        _save({"step": step, "model": model_state, "optimizer": optimizer_state, "meta": meta or {}}, d / "state.pt")
    return d


def publish(root, step: int, keep: int = 2) -> None:
    """Point `latest` at checkpoint `step` (call once every rank has written) and prune old ones."""
    root = Path(root)
    atomic_write_text(root / LATEST, step_dir(root, step).name + "\n")
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[:-keep]:
        if old.name != step_dir(root, step).name:
            shutil.rmtree(old, ignore_errors=True)


def latest(root) -> Path | None:
    """The newest complete checkpoint directory, or None when there is none."""
    pointer = Path(root) / LATEST
    if not pointer.exists():
        return None
    d = Path(root) / pointer.read_text().strip()
    return d if (d / "state.pt").exists() else None


def load(root, rank: int, expect_meta: dict | None = None) -> tuple[dict, dict | None]:
    """(state, rng) of the latest checkpoint for `rank`; RuntimeSetupError when it does not fit."""
    d = latest(root)
    if d is None:
        raise RuntimeSetupError(
            f"checkpoint_dir={str(root)!r}: resume=True but no complete checkpoint is there; "
            "run without resume first, or point checkpoint_dir at a run that saved one")
    state = torch.load(d / "state.pt", map_location="cpu", weights_only=True)
    for key, want in (expect_meta or {}).items():
        have = state["meta"].get(key)
        if have != want:
            raise RuntimeSetupError(
                f"checkpoint {str(d)!r}: {key} was {have!r} when saved but is {want!r} now; "
                f"resume with the same {key} or start a new checkpoint_dir")
    rng_path = d / f"rng_rank{rank}.pt"
    rng = torch.load(rng_path, map_location="cpu", weights_only=True) if rng_path.exists() else None
    return state, rng
