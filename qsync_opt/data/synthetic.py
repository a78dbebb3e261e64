"""Deterministic synthetic training data, addressed by global sample index.

Sample i is the same tensor whichever rank reads it and however the global batch is split,
so a 2-rank run and a 1-process run see identical data and a resumed run continues exactly.
Inputs are drawn in fixed chunks of CHUNK samples, each from its own seeded generator.
Targets come from a frozen "teacher": the same architecture built with another seed, whose
argmax output, after a per-class affine calibration that balances the classes, is the label
(a randomly initialised network sends almost every input to one class: docs/data.md). The
calibration is fitted once on a fixed, seeded set of CALIB_CHUNKS chunks apart from training and
test data, so it is the same on every rank and in every run. That makes the task learnable for any zoo model (classification
or language modelling) without downloading a dataset. Labels are computed in fp32 on the
reading rank; ranks whose kernels differ (another oneDNN ISA) could in principle disagree on
an exact tie of teacher logits.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F

from qsync_opt.models.from_spec import build_from_spec as build_model
from qsync_opt.models.from_spec import input_maker
from qsync_opt.models.private_rng import private_rng
from qsync_opt.models.spec import ModelJob
from qsync_opt.models.zoo import get_entry

CHUNK = 64
CALIB_CHUNKS = 4
"""Chunks (256 samples) whose teacher logits fit the class-balancing calibration."""
_TEACHER_SEED_OFFSET = 1_000_003
TEST_START = CHUNK << 31
"""Held-out samples start at chunk 2**31: torch's CPU generator keeps 32 bits of a seed, so test
chunks are seeded apart from the first 2**31 training chunks (137 billion samples)."""
_CALIB_START_CHUNK = (TEST_START // CHUNK) + (1 << 30)
"""Calibration chunks: seeded apart from the training chunks and from the first 2**30 test chunks."""


def shard(local_batches: list[int], rank: int) -> tuple[int, int]:
    """(offset, size) of `rank`'s slice of each global batch; ranks take slices in rank order."""
    return sum(local_batches[:rank]), local_batches[rank]


class SyntheticTask:
    """Inputs by global index, teacher labels, and the loss; the same on every rank."""

    def __init__(self, spec: ModelJob, *, cache_chunks: int = 8, test_samples: int = 1024):
        self.test_samples = test_samples
        self.seed = spec.training.seed if spec.training else 0
        self._make_inputs = input_maker(spec)
        with private_rng(self.seed + _TEACHER_SEED_OFFSET):  # never torch's global RNG (thread-safe)
            self.teacher = build_model(spec).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self._lm = spec.model.name is not None and get_entry(spec.model.name).task == "language_modelling"
        self._cache: OrderedDict[int, tuple[tuple[torch.Tensor, ...], torch.Tensor]] = OrderedDict()
        self._cache_chunks = cache_chunks
        self._calibration: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def _teacher(self, inputs) -> torch.Tensor:
        with torch.no_grad():
            return self.teacher(*inputs).float()

    def _logits(self, inputs) -> torch.Tensor:
        out = self._teacher(inputs)
        return out.reshape(-1, out.size(-1))

    def _calibrate(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean, std, bias) per class: label = argmax((logits - mean) / std - bias).

        Standardising each class's logit removes the offset that makes one class win almost
        everywhere; the bias then equalises the class counts on the calibration set (a few
        multiplicative steps, deterministic), where it has at least 8 samples per class."""
        if self._calibration is None:
            logits = []
            for k in range(CALIB_CHUNKS):
                g = torch.Generator().manual_seed(self.seed * 7_919 + _CALIB_START_CHUNK + k)
                logits.append(self._logits(tuple(self._make_inputs(CHUNK, g))))
            z = torch.cat(logits).double()
            mean, std = z.mean(0), z.std(0).clamp_min(1e-12)
            z = (z - mean) / std
            n, classes = z.shape
            bias = torch.zeros(classes, dtype=torch.float64)
            if n >= 8 * classes:
                target = n / classes
                for _ in range(200):
                    counts = torch.bincount((z - bias).argmax(-1), minlength=classes).double()
                    if counts.max() <= 1.25 * target and counts.min() >= 0.75 * target:
                        break
                    bias += 0.1 * torch.log((counts + 1) / (target + 1))
            self._calibration = (mean, std, bias)
        return self._calibration

    def label(self, inputs) -> torch.Tensor:
        """The teacher's class-balanced labels of a batch of inputs."""
        mean, std, bias = self._calibrate()
        out = self._teacher(inputs)  # (batch, classes), or (batch, tokens, vocab) for a language model
        labels = ((out.reshape(-1, out.size(-1)).double() - mean) / std - bias).argmax(-1)
        return labels.reshape(out.shape[:-1])

    def _chunk(self, c: int):
        if c in self._cache:
            self._cache.move_to_end(c)
            return self._cache[c]
        g = torch.Generator().manual_seed(self.seed * 7_919 + c)
        inputs = tuple(self._make_inputs(CHUNK, g))
        labels = self.label(inputs)
        self._cache[c] = (inputs, labels)
        if len(self._cache) > self._cache_chunks:
            self._cache.popitem(last=False)
        return self._cache[c]

    def samples(self, start: int, count: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Inputs and targets of global samples start .. start+count-1."""
        ins, tgts = [], []
        i, end = start, start + count
        while i < end:
            c, off = divmod(i, CHUNK)
            take = min(end - i, CHUNK - off)
            inputs, labels = self._chunk(c)
            ins.append(tuple(t[off:off + take] for t in inputs))
            tgts.append(labels[off:off + take])
            i += take
        inputs = tuple(torch.cat([x[k] for x in ins]) for k in range(len(ins[0])))
        return inputs, torch.cat(tgts)

    def batch(self, step: int, global_batch: int, offset: int, size: int):
        """This rank's part of global batch `step`: samples step*B + offset ... + size."""
        return self.samples(step * global_batch + offset, size)

    def test_batches(self, batch: int):
        """Held-out samples (teacher-labelled like the training stream), `batch` at a time."""
        for start in range(0, self.test_samples, batch):
            yield self.samples(TEST_START + start, min(batch, self.test_samples - start))

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over samples (and positions, for language models)."""
        return F.cross_entropy(output.reshape(-1, output.size(-1)).float(), targets.reshape(-1))

