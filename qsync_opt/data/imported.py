"""A user's data factory (`data.import: "pkg.module:factory"`) and where it is looked for.

The launching process and every worker find user code the same way: the spec's folder and
the current directory go in front of the import path (`import_paths`, and `PYTHONPATH` for
the ranks' environments), so a factory beside the spec works without setting anything by hand.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from torch.utils.data import Dataset

from qsync_opt.errors import SpecError
from qsync_opt.importing import resolve_callable


def import_paths(spec_path: "str | Path | None") -> list[str]:
    """The spec's folder (when the spec came from a file) and the current directory, absolute."""
    out = []
    if spec_path is not None and isinstance(spec_path, (str, Path)) and Path(spec_path).is_file():
        out.append(str(Path(spec_path).resolve().parent))
    out.append(os.getcwd())
    return list(dict.fromkeys(out))


def add_to_sys_path(paths: list[str]) -> None:
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)


def with_pythonpath(env: dict[str, str], paths: list[str]) -> dict[str, str]:
    """`env` with `paths` in front of its PYTHONPATH (for spawned ranks)."""
    old = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**env, "PYTHONPATH": os.pathsep.join(dict.fromkeys([*paths, *old]))}


def load_datasets(path: str, kwargs: dict) -> tuple[Dataset, Dataset]:
    """Import and call the factory; check it returned a train and a test Dataset."""
    obj = resolve_callable(path, "data.import")
    try:
        result = obj(**kwargs)
    except Exception as e:  # noqa: BLE001 - report the user's error as bad input, not a traceback
        raise SpecError(f"data.import: factory {path!r} raised {type(e).__name__}: {e} "
                        f"(called with data.kwargs={kwargs!r})") from None
    if isinstance(result, dict):
        missing = [k for k in ("train", "test") if k not in result]
        if missing:
            raise SpecError(f"data.import: {path!r} returned a dict without {missing}; return {{'train': ..., 'test': ...}}")
        result = (result["train"], result["test"])
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise SpecError(f"data.import: {path!r} returned {type(result).__name__}; return (train, test) Datasets")
    for which, ds in zip(("train", "test"), result):
        if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")):
            raise SpecError(f"data.import: the {which} set from {path!r} is a {type(ds).__name__}, not a map-style "
                            "torch.utils.data.Dataset (it needs __getitem__ and __len__)")
        if len(ds) == 0:
            raise SpecError(f"data.import: the {which} set from {path!r} is empty")
    return result[0], result[1]
