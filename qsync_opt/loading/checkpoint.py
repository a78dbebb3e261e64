"""The data plane's state on disk.

`save_state` / `load_state`: the whole state in one file, written atomically (temp file,
fsync, rename), so a kill -9 at any instant leaves the previous state or the new one.

`DiffCheckpointer`: the state as it goes into a training checkpoint, differentially. Every
`full_every`-th save writes the whole state to the store (one atomic JSON file per full
state, `full_<step>.json`) and the checkpoint carries it whole; the saves in between carry
only what changed since that full one (`delta`: the [path, value] pairs that differ) and the
full one's step and SHA-256. A resume reads the checkpoint's record, the full state it names
(checksum checked), and applies the delta. The full file is written, and fsynced, before any
record names it, so a kill -9 at any instant leaves every published checkpoint resolvable.

What changes between saves is the step, the cursors and epochs of the sources that gave
samples, and the mix deficits; names, sizes, seed, batch and version never do. The state is
small (O(number of sources)); the source indexes (lengths), the large part, never change and
are not checkpointed at all.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections import deque
from pathlib import Path

from qsync_opt.errors import SpecError


def save_state(path: str | Path, state: dict) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_state(path: str | Path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"data-plane checkpoint {str(path)!r} does not exist; start without resume") from None
    except json.JSONDecodeError as e:
        raise SpecError(f"data-plane checkpoint {str(path)!r} is not valid JSON ({e})") from None


# ---- differential -------------------------------------------------------------------------
def diff(base, new, path=()) -> list[list]:
    """[path, value] for every leaf of `new` that differs from `base` (dicts by key, lists of
    equal length by index; anything else, or a changed shape, replaced whole)."""
    if isinstance(base, dict) and isinstance(new, dict) and base.keys() == new.keys():
        return [d for k in new for d in diff(base[k], new[k], (*path, k))]
    if isinstance(base, list) and isinstance(new, list) and len(base) == len(new):
        return [d for i, (a, b) in enumerate(zip(base, new)) for d in diff(a, b, (*path, i))]
    return [] if base == new and type(base) is type(new) else [[list(path), copy.deepcopy(new)]]


def patch(base, delta: list[list]):
    """`base` with every [path, value] of `delta` applied (a new object; `base` is not changed)."""
    out = copy.deepcopy(base)
    for path, value in delta:
        if not path:
            out = copy.deepcopy(value)
            continue
        node = out
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = copy.deepcopy(value)
    return out


def _canonical(state: dict) -> bytes:
    return json.dumps(state, sort_keys=True, separators=(",", ":")).encode()


class DiffCheckpointer:
    """Records of a data plane's state for a training checkpoint: full every `full_every`
    saves (also written to `store`), else the delta against the last full one."""

    def __init__(self, store: str | Path, full_every: int = 8, keep: int = 2):
        if not (isinstance(full_every, int) and full_every >= 1):
            raise SpecError(f"data-plane checkpoint: full_every must be an integer >= 1, got {full_every!r}")
        self.store, self.full_every, self.keep = Path(store), full_every, keep
        self._base: tuple[int, dict, str] | None = None  # (step, state, sha256) of the last full one
        self._since = 0
        self._bases = deque(maxlen=max(1, keep))  # base step of the newest `keep` records

    def _full_path(self, step: int) -> Path:
        return self.store / f"full_{step:08d}.json"

    def record(self, step: int, state: dict) -> dict:
        """The record to put into checkpoint `step`: {'kind': 'full', ...} or {'kind': 'delta', ...}."""
        if self._base is None or self._since >= self.full_every - 1:
            data = _canonical(state)
            self.store.mkdir(parents=True, exist_ok=True)
            path = self._full_path(step)
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            sha = hashlib.sha256(data).hexdigest()
            self._base, self._since = (step, copy.deepcopy(state), sha), 0
            self._bases.append(step)
            return {"kind": "full", "base_step": step, "base_sha256": sha, "state": copy.deepcopy(state)}
        self._since += 1
        step0, base, sha = self._base
        self._bases.append(step0)
        return {"kind": "delta", "base_step": step0, "base_sha256": sha, "delta": diff(base, state)}

    def restore(self, record: dict) -> dict:
        """The state a record stands for; the chain continues from its full state."""
        state = resolve(self.store, record)
        if record["kind"] == "full":
            base = record["state"]
        else:
            base = json.loads(self._full_path(record["base_step"]).read_text())
        self._base = (int(record["base_step"]), base, record["base_sha256"])
        self._since = 0 if record["kind"] == "full" else self.full_every  # next save: a fresh full one
        self._bases.append(int(record["base_step"]))
        return state

    def prune(self) -> list[Path]:
        """Delete full states older than every base the newest `keep` records name (the
        training checkpoints pruned with them no longer need them); returns what was deleted."""
        if not self._bases or not self.store.exists():
            return []
        oldest = min(self._bases)
        gone = []
        for p in sorted(self.store.glob("full_*.json")):
            try:
                step = int(p.stem.split("_")[1])
            except (IndexError, ValueError):
                continue
            if step < oldest:
                p.unlink(missing_ok=True)
                gone.append(p)
        return gone


def resolve(store: str | Path, record: dict) -> dict:
    """The full state behind a checkpoint record (the full one itself, or its base with the delta applied)."""
    kind = record.get("kind") if isinstance(record, dict) else None
    if kind == "full":
        return copy.deepcopy(record["state"])
    if kind != "delta":
        raise SpecError(f"data-plane checkpoint record: kind {kind!r} is neither 'full' nor 'delta'; the checkpoint "
                        "was not written by this build")
    path = Path(store) / f"full_{int(record['base_step']):08d}.json"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"data-plane checkpoint: the full state {str(path)!r} this checkpoint's delta is based on "
                        "is missing; resume from a checkpoint with a full data-plane state, or start fresh") from None
    if hashlib.sha256(data).hexdigest() != record["base_sha256"]:
        raise SpecError(f"data-plane checkpoint: {str(path)!r} does not match the checksum its delta recorded "
                        "(changed or corrupted); resume from another checkpoint or start fresh")
    return patch(json.loads(data), record["delta"])
