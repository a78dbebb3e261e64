"""Readable sources for the data plane: every sample's length up front, the sample on demand.

The coordinator needs only the lengths (the index); the samples are read where they are
consumed (the rank, or a Ray loader actor). A source that raises while read ends the job
with `SourceReadError` naming it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from qsync_opt.data.sources import SourceSpec
from qsync_opt.data.text import is_test_file, read_files, stdlib_files
from qsync_opt.errors import QSyncError, SpecError
from qsync_opt.spec.importing import resolve_callable


class SourceReadError(QSyncError):
    """A source raised while a sample was read; the message names the source and the sample."""


MAX_SYNTHETIC_SAMPLES = 100_000_000
"""The most samples a synthetic-lm source makes: its lengths are one in-memory array."""


class SyntheticLM:
    """Token sequences with log-normal lengths; sample i is the same on every process."""

    def __init__(self, num_samples: int = 10_000, median: float = 128, sigma: float = 0.8, min_len: int = 8,
                 max_len: int = 2048, vocab: int = 256, seed: int = 0):
        if num_samples < 1 or min_len < 1 or max_len < min_len or vocab < 2:
            raise SpecError(f"builtin synthetic-lm: need num_samples >= 1, 1 <= min_len <= max_len, vocab >= 2; got "
                            f"num_samples={num_samples}, min_len={min_len}, max_len={max_len}, vocab={vocab}")
        if num_samples > MAX_SYNTHETIC_SAMPLES:
            raise SpecError(f"builtin synthetic-lm: num_samples={num_samples:,} is more than {MAX_SYNTHETIC_SAMPLES:,} "
                            "(its index of lengths is held in memory); give fewer")
        if not (math.isfinite(median) and median > 0 and math.isfinite(sigma) and sigma >= 0):
            raise SpecError(f"builtin synthetic-lm: need a finite median > 0 and a finite sigma >= 0; got median={median}, "
                            f"sigma={sigma}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise SpecError(f"builtin synthetic-lm: seed must be an integer >= 0, got {seed!r}")
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


class PySourceLM:
    """The training files of data set 'pysource' (bytes as tokens) cut into consecutive,
    non-overlapping pieces with log-normal lengths: real text of varying length, no download.
    Sample i is bytes [offset_i, offset_i + length_i) of the text from `skip_bytes` on."""

    def __init__(self, median: float = 64, sigma: float = 0.8, min_len: int = 8, max_len: int = 512,
                 train_bytes: int = 1_000_000, skip_bytes: int = 0, seed: int = 0):
        for name, v, lo in (("min_len", min_len, 2), ("max_len", max_len, 2), ("train_bytes", train_bytes, 2),
                            ("skip_bytes", skip_bytes, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise SpecError(f"builtin pysource-lm: {name} must be an integer >= {lo}, got {v!r}")
        if max_len < min_len or not median > 0 or not sigma >= 0:
            raise SpecError(f"builtin pysource-lm: need 2 <= min_len <= max_len, median > 0 and sigma >= 0; got "
                            f"min_len={min_len}, max_len={max_len}, median={median}, sigma={sigma}")

        text = read_files([f for f in stdlib_files() if not is_test_file(f.name)], skip_bytes + train_bytes)[skip_bytes:]
        if len(text) < min_len:
            raise SpecError(f"builtin pysource-lm: skip_bytes={skip_bytes} leaves {len(text)} bytes of text, less than "
                            f"one sample of min_len={min_len}; lower skip_bytes")
        rng = np.random.default_rng([seed, 0x53])
        lengths, have = [], 0
        while True:
            L = int(np.clip(round(float(np.exp(np.log(median) + sigma * rng.standard_normal()))), min_len, max_len))
            if have + L > len(text):
                break
            lengths.append(L)
            have += L
        self.lengths = np.asarray(lengths, dtype=np.int32)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.text = np.frombuffer(text, dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):
        import torch

        o, L = int(self.offsets[i]), int(self.lengths[i])
        return torch.from_numpy(self.text[o:o + L].astype(np.int64))


BUILTIN_CLASSES = {"synthetic-lm": (SyntheticLM, "num_samples, median, sigma, min_len, max_len, vocab, seed"),
                   "pysource-lm": (PySourceLM, "median, sigma, min_len, max_len, train_bytes, skip_bytes, seed")}


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
    if spec.builtin is not None:
        cls, takes = BUILTIN_CLASSES[spec.builtin]
        try:
            ds = cls(**spec.kwargs)
        except SpecError as e:
            raise SpecError(f"{field}.kwargs: {e}") from None
        except TypeError as e:
            raise SpecError(f"{field}.kwargs: {e}; {spec.builtin} takes {takes}") from None
        except (ValueError, OverflowError, MemoryError) as e:  # a value the generator cannot use
            raise SpecError(f"{field}.kwargs: builtin {spec.builtin} refused {spec.kwargs} ({type(e).__name__}: "
                            f"{e}); {spec.builtin} takes {takes}") from None
        if len(ds) == 0:
            raise SpecError(f"{field}.kwargs: builtin {spec.builtin} made no samples; raise train_bytes or lower min_len")
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
