"""pysource: the standard library's own source as a byte-level language-modelling set."""

from __future__ import annotations

import pytest
import torch

from qsync_opt.data.text import is_test_file, pysource, stdlib_files
from qsync_opt.errors import SpecError
from qsync_opt.training.spec import load_spec


def test_windows_are_next_byte_pairs_of_real_source_split_by_file():
    xtr, ytr, xte, yte = pysource(seq_len=32, train_bytes=20_000, test_bytes=5_000)
    assert xtr.dtype == ytr.dtype == torch.int64 and xtr.shape == (20_000 // 33, 32) and xte.shape == (5_000 // 33, 32)
    assert torch.equal(xtr[:, 1:], ytr[:, :-1]) and torch.equal(xte[:, 1:], yte[:, :-1])  # targets: the next byte
    assert 0 <= int(xtr.min()) and int(xtr.max()) < 256
    files = stdlib_files()
    train = [f for f in files if not is_test_file(f.name)]
    test = [f for f in files if is_test_file(f.name)]
    assert train and test and not {f.name for f in train} & {f.name for f in test}
    assert 0.04 < len(test) / len(files) < 0.2  # about one file in ten
    head = bytes(xtr[0].tolist())
    assert head == train[0].read_bytes()[:32]  # the first training window is the first training file's start
    assert bytes(xte[0].tolist()) == test[0].read_bytes()[:32]
    again = pysource(seq_len=32, train_bytes=20_000, test_bytes=5_000)
    assert all(torch.equal(a, b) for a, b in zip((xtr, ytr, xte, yte), again))


def _spec(tmp_path, data, vocab=300, seq=16):
    return load_spec({
        "cluster": {"groups": [{"name": "a", "device": "cpu-local"}], "interconnect": "loopback"},
        "model": {"import": "x.y:z", "input_shape": [seq], "input_dtype": "int64", "kwargs": {"vocab_size": vocab}},
        "training": {"global_batch": 4}, "data": data})


def test_task_reads_the_models_sequence_length_and_checks_the_vocabulary(tmp_path):
    from qsync_opt.data.task import build_task

    task = build_task(_spec(tmp_path, {"name": "pysource", "kwargs": {"train_bytes": 3400, "test_bytes": 340}}))
    (x,), y = task.samples(0, 3)
    assert x.shape == y.shape == (3, 16) and task.n == 3400 // 17
    with pytest.raises(SpecError, match=r"model\.kwargs\.vocab_size: 100 is below the 256 byte values"):
        build_task(_spec(tmp_path, {"name": "pysource"}, vocab=100))
    with pytest.raises(SpecError, match=r"data\.kwargs: \['size'\] are not options of data set 'pysource'"):
        build_task(_spec(tmp_path, {"name": "pysource", "kwargs": {"size": 3}}))
    with pytest.raises(SpecError, match=r"data\.kwargs\.seq_len: got 0"):
        build_task(_spec(tmp_path, {"name": "pysource", "kwargs": {"seq_len": 0}}))


def test_evaluation_reports_perplexity_per_token():
    from torch.utils.data import TensorDataset

    from qsync_opt.data.evaluation import evaluate
    from qsync_opt.data.task import DatasetTask

    _, _, xte, yte = pysource(seq_len=8, train_bytes=900, test_bytes=900)
    task = DatasetTask(TensorDataset(xte, yte), TensorDataset(xte, yte))

    class Uniform(torch.nn.Module):
        def forward(self, ids):
            return torch.zeros(*ids.shape, 256)

    r = evaluate(Uniform(), task, batch=7)
    assert r["test_samples"] == xte.numel()
    assert r["test_loss"] == pytest.approx(torch.log(torch.tensor(256.0)).item(), rel=1e-6)
    assert r["test_perplexity"] == pytest.approx(256.0, rel=1e-5)  # a uniform guess over 256 bytes
