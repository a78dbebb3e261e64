"""A classification task over a real dataset, read by global sample index.

Training sample i is `train[perm_e[i mod N]]` with e = i div N and perm_e a permutation
seeded by the job's seed and the epoch: a pure function of i, so every rank reads exactly its
slice of every global batch (offset and size from its group's local batch) and a resumed run
continues with the very samples it would have read.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset, default_collate

from qsync_opt.errors import SpecError
from qsync_opt.data import builtin
from qsync_opt.data.config import DataSpec
from qsync_opt.data.imported import load_datasets
from qsync_opt.data.synthetic import SyntheticTask
from qsync_opt.data.text import pysource
from qsync_opt.models.spec import ModelJob
from qsync_opt.models.zoo import get_entry


class DataJob(ModelJob, Protocol):
    """What the data layer reads of a job: `ModelJob`'s model and training sections, and its data
    section (absent or None: the synthetic teacher task). A training `JobSpec` is one."""

    @property
    def data(self) -> DataSpec | None: ...


class DatasetTask:
    """Inputs and labels by global index, the test set in batches, and the loss."""

    def __init__(self, train: Dataset, test: Dataset, *, seed: int = 0, input_shape=None, source: str = "data"):
        self.train, self.test, self.seed, self.source = train, test, seed, source
        self.input_shape = tuple(input_shape) if input_shape else None
        self.n = len(train)
        self._perms: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.pop(next(iter(self._perms)))
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms[epoch] = torch.randperm(self.n, generator=g)
        return self._perms[epoch]

    def indices(self, start: int, count: int) -> torch.Tensor:
        """Training-set indices of global samples start .. start+count-1."""
        pos = torch.arange(start, start + count)
        epochs, offs = pos // self.n, pos % self.n
        out = torch.empty(count, dtype=torch.long)
        for e in epochs.unique().tolist():
            mask = epochs == e
            out[mask] = self._perm(e)[offs[mask]]
        return out

    def _gather(self, ds: Dataset, idx: torch.Tensor):
        if isinstance(ds, TensorDataset) and len(ds.tensors) == 2:
            x, y = ds.tensors[0][idx], ds.tensors[1][idx]
        else:
            items = [ds[int(i)] for i in idx]
            if not all(isinstance(it, (tuple, list)) and len(it) == 2 for it in items[:1]):
                raise SpecError(f"data: samples of {self.source!r} must be (input, label) pairs, "
                                f"got {type(items[0]).__name__}")
            x, y = default_collate(items)
            x, y = torch.as_tensor(x), torch.as_tensor(y)
        if self.input_shape is not None:
            try:
                x = x.reshape(len(idx), *self.input_shape)
            except RuntimeError as e:
                raise SpecError(f"data.input_shape: {list(self.input_shape)} does not fit samples of shape "
                                f"{list(x.shape[1:])} from {self.source!r} ({e})") from None
        if x.is_floating_point():
            x = x.float()
        return (x,), y.long()

    def samples(self, start: int, count: int):
        return self._gather(self.train, self.indices(start, count))

    def batch(self, step: int, global_batch: int, offset: int, size: int):
        """This rank's part of global batch `step`: samples step*B + offset ... + size."""
        return self.samples(step * global_batch + offset, size)

    def test_batches(self, batch: int):
        for start in range(0, len(self.test), batch):
            yield self._gather(self.test, torch.arange(start, min(start + batch, len(self.test))))

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.size(-1)).float(), targets.reshape(-1))


def build_task(spec: DataJob):
    """The spec's data: its `data:` section, or the synthetic teacher task when it has none."""
    data = getattr(spec, "data", None)
    seed = spec.training.seed if spec.training else 0
    if data is None or data.source == "synthetic":
        kw = dict(data.kwargs) if data is not None else {}
        bad = sorted(set(kw) - {"test_samples"})
        if bad:
            raise SpecError(f"data.kwargs: {bad} are not options of data set 'synthetic'; it accepts ['test_samples']")
        return SyntheticTask(spec, **kw)
    if data.import_ is not None:
        train, test = load_datasets(data.import_, dict(data.kwargs))
        return DatasetTask(train, test, seed=seed, input_shape=data.input_shape, source=data.import_)
    if data.name == "pysource":
        kw = dict(data.kwargs)
        bad = sorted(set(kw) - {"seq_len", "train_bytes", "test_bytes"})
        if bad:
            raise SpecError(f"data.kwargs: {bad} are not options of data set 'pysource'; it accepts "
                            "['seq_len', 'train_bytes', 'test_bytes']")
        kw.setdefault("seq_len", sequence_length(spec))
        vocab = spec.model.kwargs.get("vocab_size")
        if isinstance(vocab, int) and vocab < 256:
            raise SpecError(f"model.kwargs.vocab_size: {vocab} is below the 256 byte values of data set 'pysource'; "
                            "set vocab_size >= 256")
        xtr, ytr, xte, yte = pysource(**kw)
        return DatasetTask(TensorDataset(xtr, ytr), TensorDataset(xte, yte), seed=seed, input_shape=data.input_shape,
                           source="pysource")
    xtr, ytr, xte, yte = builtin.load_builtin(data.name, dict(data.kwargs))
    shape = data.input_shape or builtin.NATURAL_SHAPE[data.name]
    return DatasetTask(TensorDataset(xtr, ytr), TensorDataset(xte, yte), seed=seed, input_shape=shape, source=data.name)


def sequence_length(spec: ModelJob) -> int:
    """The model's sequence length: training.seq_len, an imported model's input_shape, or the zoo default."""
    if spec.training and spec.training.seq_len:
        return spec.training.seq_len
    if spec.model.input_shape:
        return int(spec.model.input_shape[-1])
    if spec.model.name is not None:
        seq = get_entry(spec.model.name).defaults.get("seq_len")
        if seq:
            return int(seq)
    raise SpecError("data.kwargs.seq_len: 'pysource' needs a sequence length; set data.kwargs.seq_len or training.seq_len")
