"""Synthetic data by global sample index: every split of the global batch sees the same samples."""

from __future__ import annotations

import pytest
import torch
from rt_jobs import write_spec

from qsync_opt.errors import SpecError
from qsync_opt.runtime.data import CHUNK, SyntheticTask, shard
from qsync_opt.training.spec import load_spec


def test_samples_do_not_depend_on_how_the_batch_is_split(tmp_path):
    task = SyntheticTask(write_spec(tmp_path / "s.yaml"))
    start = CHUNK - 5  # crosses a chunk boundary
    (whole,), y = task.samples(start, 12)
    parts = [task.samples(start + off, n) for off, n in ((0, 7), (7, 5))]
    assert torch.equal(whole, torch.cat([p[0][0] for p in parts])) and torch.equal(y, torch.cat([p[1] for p in parts]))
    fresh = SyntheticTask(write_spec(tmp_path / "s2.yaml"))  # another process would build the same data
    assert torch.equal(fresh.samples(start, 12)[0][0], whole)


def test_ranks_take_consecutive_slices_of_each_global_batch():
    batches = [20, 12, 12]
    assert [shard(batches, r) for r in range(3)] == [(0, 20), (20, 12), (32, 12)]


def test_teacher_labels_are_learnable_classes_and_tokens(tmp_path):
    task = SyntheticTask(write_spec(tmp_path / "cnn.yaml"))
    _, y = task.samples(0, 64)
    assert y.dtype == torch.int64 and 0 <= y.min() and y.max() < 10
    lm = SyntheticTask(write_spec(tmp_path / "gpt.yaml", model="tiny-gpt2"))
    (ids,), tgt = lm.samples(0, 3)
    assert ids.shape == tgt.shape == (3, 32) and tgt.max() < 1000
    logits = torch.randn(3, 32, 1000)
    assert torch.isfinite(lm.loss(logits, tgt))


def test_imported_token_model_needs_a_vocabulary(tmp_path):
    spec = load_spec({"cluster": {"groups": [{"name": "a", "device": "cpu-local"}]},
                      "model": {"import": "torch.nn:Identity", "input_shape": [8], "input_dtype": "int64"},
                      "training": {"global_batch": 4}})
    with pytest.raises(SpecError, match=r"model.kwargs.vocab_size: got None"):
        SyntheticTask(spec)
