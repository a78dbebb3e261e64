"""Checkpoints a resumed run continues from exactly: fp32 model, optimizer, step, every RNG.

Layout under the checkpoint directory:
    step_00000005/state.pt      model (fp32 master weights, plain FQNs), optimizer, step, meta  (rank 0)
    step_00000005/rng_rank1.pt  that rank's RNG states (dropout, stochastic rounding)          (every rank)
    step_00000005/COMPLETE      completion marker: the SHA-256 of every file above (written last)
    latest                      name of the newest published checkpoint directory (informative)
Every file is written atomically; COMPLETE is written only after every rank has written its
files, and a checkpoint counts only when COMPLETE is there and every checksum matches. So a
kill at any moment, a truncated or bit-flipped file, leaves a checkpoint that resume skips
(saying why) in favour of the newest valid one. Everything is stored as tensors and plain
Python values, so loading uses torch.load(weights_only=True).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from qsync_opt.errors import RuntimeSetupError
from qsync_opt.io import atomic_write_bytes, atomic_write_text

LATEST = "latest"
MARKER = "COMPLETE"


def step_dir(root: "str | Path", step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def _save(obj, path: Path) -> str:
    """Write `obj` atomically; return the SHA-256 of the bytes written."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def save_rank_files(root, step: int, rank: int, *, model_state=None, optimizer_state=None, meta=None,
                    extra: dict | None = None) -> dict[str, str]:
    """Write this rank's part of checkpoint `step` (rank 0 also passes model and optimizer state).

    `extra`: more plain values for state.pt (e.g. the data plane's checkpoint record).
    Returns file name -> SHA-256 of what was written, for the completion marker.
    """
    d = step_dir(root, step)
    sums = {f"rng_rank{rank}.pt": _save(rng_state(), d / f"rng_rank{rank}.pt")}
    if model_state is not None:
        sums["state.pt"] = _save({**(extra or {}), "step": step, "model": model_state, "optimizer": optimizer_state,
                                  "meta": meta or {}}, d / "state.pt")
    return sums


def publish(root, step: int, checksums: dict[str, str] | None = None, keep: int = 2) -> None:
    """Mark checkpoint `step` complete (call once every rank has written) and prune old valid ones.

    `checksums` are the ranks' own (file -> SHA-256); without them the files are hashed here.
    Only complete checkpoints older than the `keep` newest complete ones are removed: an
    invalid directory is evidence for the user and is never deleted by a prune.
    """
    root, d = Path(root), step_dir(root, step)
    if checksums is None:
        checksums = {p.name: _sha256(p) for p in sorted(d.glob("*.pt"))}
    atomic_write_text(d / MARKER, json.dumps({"step": step, "files": checksums}, indent=1, sort_keys=True) + "\n")
    atomic_write_text(root / LATEST, d.name + "\n")
    complete = [p for p in sorted(root.glob("step_*")) if p.is_dir() and (p / MARKER).exists()]
    for old in complete[:-keep]:
        if old.name != d.name:
            shutil.rmtree(old, ignore_errors=True)


def problem(d: Path, rank: int | None = None) -> str | None:
    """Why checkpoint directory `d` cannot be resumed from, or None when it is valid.

    Checks the completion marker, that every file it lists exists with its recorded
    checksum, and (with `rank`) that this rank's RNG file is there.
    """
    marker = d / MARKER
    if not marker.exists():
        return f"no {MARKER} marker (the run stopped while writing it)"
    try:
        files = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"its {MARKER} marker is unreadable"
    if "state.pt" not in files:
        return f"its {MARKER} marker lists no state.pt"
    for name, want in sorted(files.items()):
        p = d / name
        if not p.exists():
            return f"{name} is missing"
        if _sha256(p) != want:
            return f"{name} does not match its checksum (truncated or corrupted, {p.stat().st_size} bytes)"
    if rank is not None and f"rng_rank{rank}.pt" not in files:
        return f"it has no RNG state for rank {rank} (saved by a run with fewer ranks)"
    return None


@dataclass
class Choice:
    """The checkpoint resume will use, and the newer ones it passed over, with the reason."""

    path: Path | None
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"skipped checkpoint {str(p)!r}: {why}" for p, why in self.skipped]
        if self.path is not None:
            lines.append(f"resuming from {str(self.path)!r}")
        return "\n".join(lines)


def choose(root, rank: int | None = None) -> Choice:
    """The newest valid checkpoint under `root` (see `problem`), with what was skipped."""
    skipped = []
    for d in sorted((p for p in Path(root).glob("step_*") if p.is_dir()), reverse=True):
        why = problem(d, rank)
        if why is None:
            return Choice(d, skipped)
        skipped.append((d, why))
    return Choice(None, skipped)


def latest(root) -> Path | None:
    """The newest valid checkpoint directory, or None when there is none."""
    return choose(root).path


def require(root, rank: int | None = None) -> Choice:
    """`choose`, but a RuntimeSetupError naming the directory when nothing there is valid."""
    c = choose(root, rank)
    if c.path is None:
        detail = "".join(f"\n  - {p.name}: {why}" for p, why in c.skipped) or " (it holds no step_* directories)"
        raise RuntimeSetupError(
            f"checkpoint_dir={str(root)!r}: resume=True but no valid checkpoint is there{detail}\n"
            "run without resume (a fresh start), or point checkpoint_dir at a run that saved one")
    return c


def load(root, rank: int, expect_meta: dict | None = None, path: "str | Path | None" = None) -> tuple[dict, dict | None]:
    """(state, rng) of checkpoint `path` (default: the newest valid one) for `rank`.

    RuntimeSetupError when there is none, or when it was saved by another setup.
    """
    d = Path(path) if path is not None else require(root, rank).path
    try:
        state = torch.load(d / "state.pt", map_location="cpu", weights_only=True)
        rng_path = d / f"rng_rank{rank}.pt"
        rng = torch.load(rng_path, map_location="cpu", weights_only=True) if rng_path.exists() else None
    except Exception as e:  # a file changed after it was checked: name it, never a torch traceback
        raise RuntimeSetupError(f"checkpoint {str(d)!r} cannot be read: {type(e).__name__}: {e}; "
                                "resume from another checkpoint_dir or start fresh") from None
    for key, want in (expect_meta or {}).items():
        have = state["meta"].get(key)
        if have != want:
            raise RuntimeSetupError(
                f"checkpoint {str(d)!r}: {key} was {have!r} when saved but is {want!r} now; "
                f"resume with the same {key} or start a new checkpoint_dir")
    return state, rng
