"""The data plane's state on disk: written whole and atomically (temp file, fsync, rename), so a
kill -9 at any instant leaves the previous state or the new one, never half of either.

The state is O(number of sources) (step, per-source epoch and cursor, mix deficits; the
shuffles are recomputed from the seed), a few hundred bytes, so it is written whole each
time: a differential checkpoint would save nothing here. The source indexes (lengths), the
large part, never change during a run and are not checkpointed.
"""

from __future__ import annotations

import json
import os
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
