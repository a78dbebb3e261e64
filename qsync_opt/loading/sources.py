"""Readable sources for the data plane: every sample's length up front, the sample on demand.

The coordinator needs only the lengths (the index); the samples are read where they are
consumed (the rank, or a Ray loader actor). A source that raises while read ends the job
with `SourceReadError` naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qsync_opt.data.sources import SourceSpec
from qsync_opt.errors import QSyncError, SpecError
from qsync_opt.spec.importing import resolve_callable


class SourceReadError(QSyncError):
    """A source raised while a sample was read; the message names the source and the sample."""


class SyntheticLM:
    """Token sequences with log-normal lengths; sample i is the same on every process."""

    def __init__(self, num_samples: int = 10_000, median: float = 128, sigma: float = 0.8, min_len: int = 8,
                 max_len: int = 2048, vocab: int = 256, seed: int = 0):
        if num_samples < 1 or min_len < 1 or max_len < min_len or vocab < 2:
            raise SpecError(f"builtin synthetic-lm: need num_samples >= 1, 1 <= min_len <= max_len, vocab >= 2; got "
                            f"num_samples={num_samples}, min_len={min_len}, max_len={max_len}, vocab={vocab}")
        rng = np.random.default_rng([seed, 0x51])
        raw = np.exp(np.log(median) + sigma * rng.standard_normal(num_samples))
        self.lengths = np.clip(np.round(raw), min_len, max_len).astype(np.int32)
        self.vocab, self.seed = int(vocab), int(seed)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):
        import torch

        rng = np.random.default_rng([self.seed, 0x52, int(i)])
        return torch.from_numpy(rng.integers(0, self.vocab, int(self.lengths[i]), dtype=np.int64))


class Source:
    """A named dataset and its lengths, read by index."""

    def __init__(self, name: str, dataset, lengths):
        self.name = name
        self.dataset = dataset
        self.lengths = np.asarray(lengths, dtype=np.int32)

    def __len__(self) -> int:
        return len(self.lengths)

    def get(self, i: int):
        try:
            return self.dataset[int(i)]
        except Exception as e:
            raise SourceReadError(f"data source {self.name!r} raised {type(e).__name__} reading sample {i}: {e}") from e


def open_source(spec: SourceSpec, index: int, base_dir: str | Path | None = None) -> Source:
    field = f"data.sources.{index}"
    if spec.builtin == "synthetic-lm":
        try:
            ds = SyntheticLM(**spec.kwargs)
        except TypeError as e:
            raise SpecError(f"{field}.kwargs: {e}; synthetic-lm takes num_samples, median, sigma, min_len, max_len, "
                            "vocab, seed") from None
        return Source(spec.name, ds, ds.lengths)
    factory = resolve_callable(spec.import_, f"{field}.import")
    try:
        ds = factory(**spec.kwargs)
    except Exception as e:  # noqa: BLE001
        raise SpecError(f"{field}.import: factory {spec.import_!r} raised {type(e).__name__}: {e}") from None
    if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")):
        raise SpecError(f"{field}.import: {spec.import_!r} returned a {type(ds).__name__}, not a dataset "
                        "(it needs __getitem__ and __len__)")
    lengths = _lengths(spec, ds, field, base_dir)
    if len(lengths) != len(ds):
        raise SpecError(f"{field}.lengths: {len(lengths)} lengths for a dataset of {len(ds)} samples; give one per sample")
    if len(lengths) == 0 or int(np.min(lengths)) <= 0:
        raise SpecError(f"{field}.lengths: every sample needs a positive token count")
    return Source(spec.name, ds, lengths)


def _lengths(spec: SourceSpec, ds, field: str, base_dir) -> np.ndarray:
    v = spec.lengths
    if isinstance(v, list):
        return np.asarray(v, dtype=np.int64)
    if v == "from_source":
        got = getattr(ds, "lengths", None)
        if got is None:
            raise SpecError(f"{field}.lengths: 'from_source', but the dataset from {spec.import_!r} has no `lengths` "
                            "attribute; add one (a sequence of token counts) or list the lengths in the spec")
        return np.asarray(got, dtype=np.int64)
    path = Path(v)
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.exists():
        raise SpecError(f"{field}.lengths: file {str(path)!r} does not exist; check the path")
    return np.load(path).astype(np.int64) if path.suffix == ".npy" else np.loadtxt(path, dtype=np.int64, ndmin=1)
