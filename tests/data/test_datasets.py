"""Built-in sets load offline, split by a fixed rule; every rank reads its exact slice by global index."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from qsync_opt.data import build_task
from qsync_opt.data.task import DatasetTask
from qsync_opt.errors import SpecError
from qsync_opt.runtime.data import shard
from qsync_opt.training.spec import load_spec


def spec_with(data: dict, model=None, seed=0):
    return load_spec({"cluster": {"groups": [{"name": "a", "device": "cpu-local"}]},
                      "model": model or {"name": "tiny-cnn"}, "training": {"global_batch": 8, "seed": seed},
                      "data": data})


@pytest.mark.parametrize("name, train, test, shape", [
    ("digits", 1437, 360, (1, 8, 8)),
    ("mnist", 4000, 1000, (1, 28, 28)),
    ("mnist1d", 4000, 1000, (1, 40)),
], ids=["digits", "mnist", "mnist1d"])
def test_builtin_sets_have_the_documented_sizes_and_shapes(name, train, test, shape):
    task = build_task(spec_with({"name": name}))
    assert (len(task.train), len(task.test)) == (train, test)
    (x,), y = task.samples(0, 5)
    assert tuple(x.shape) == (5, *shape) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert 0 <= int(y.min()) and int(y.max()) <= 9
    (tx,), ty = next(task.test_batches(1000))
    assert len(tx) == test and sorted(set(ty.tolist())) == list(range(10))  # every class in the test set
    again = build_task(spec_with({"name": name}))  # another process builds the same split
    assert torch.equal(again.samples(0, 5)[0][0], x)


def test_input_shape_reshapes_each_sample():
    (x,), _ = build_task(spec_with({"name": "digits", "input_shape": [64]})).samples(0, 3)
    assert tuple(x.shape) == (3, 64)
    with pytest.raises(SpecError, match=r"data.input_shape: \[65\] does not fit samples"):
        build_task(spec_with({"name": "digits", "input_shape": [65]})).samples(0, 3)


def test_unknown_options_name_the_field():
    with pytest.raises(SpecError, match=r"data.kwargs: \['bogus'\] are not options of data set 'digits'"):
        build_task(spec_with({"name": "digits", "kwargs": {"bogus": 1}}))
    with pytest.raises(SpecError, match=r"data.kwargs.test_size: got 0"):
        build_task(spec_with({"name": "digits", "kwargs": {"test_size": 0}}))


def _task(n=10, seed=0):
    x = torch.arange(n, dtype=torch.float32).reshape(n, 1)
    return DatasetTask(TensorDataset(x, torch.arange(n)), TensorDataset(x, torch.arange(n)), seed=seed)


def test_ranks_read_consecutive_slices_of_each_global_batch_whatever_the_split():
    whole = _task()
    for step in range(4):  # 4 steps of 7 cross two epoch boundaries of a 10-sample set
        ref = whole.batch(step, 7, 0, 7)[1]
        for batches in ([4, 3], [1, 6], [2, 2, 3]):
            parts = [_task().batch(step, 7, *shard(batches, r))[1] for r in range(len(batches))]
            assert torch.equal(torch.cat(parts), ref)


def test_every_epoch_is_a_permutation_of_the_training_set_seeded_by_the_job():
    t = _task()
    epochs = [t.samples(e * 10, 10)[1] for e in range(3)]
    assert all(sorted(e.tolist()) == list(range(10)) for e in epochs)
    assert not torch.equal(epochs[0], epochs[1])  # reshuffled each epoch
    assert not torch.equal(_task(seed=1).samples(0, 10)[1], epochs[0])  # and by the seed
    late = _task().samples(25, 5)[1]  # a resumed run reads sample 25.. without having read 0..24
    assert torch.equal(late, epochs[2][5:])


def test_synthetic_default_has_a_held_out_test_set(tmp_path):
    task = build_task(load_spec({
        "cluster": {"groups": [{"name": "a", "device": "cpu-local"}]}, "model": {"name": "tiny-cnn"},
        "training": {"global_batch": 8}, "data": {"kwargs": {"test_samples": 100}}}))
    batches = list(task.test_batches(64))
    assert [len(b[1]) for b in batches] == [64, 36]
    train_x = task.samples(0, 64)[0][0]
    assert not torch.equal(batches[0][0][0], train_x)
