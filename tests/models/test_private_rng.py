"""Per-call generators: a model's random weights depend on its seed alone."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from qsync_opt.models.private_rng import private_rng
from qsync_opt.models.zoo import build_model


@pytest.mark.parametrize("name", ["tiny-resnet", "tiny-bert", "tiny-gpt2", "tiny-cnn"])
def test_same_weights_as_torch_manual_seed_and_global_rng_untouched(name):
    torch.manual_seed(5)
    reference = build_model(name).state_dict()
    torch.manual_seed(77)
    state = torch.random.get_rng_state()
    with private_rng(5):
        got = build_model(name).state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)
    assert reference.keys() == got.keys()
    assert all(torch.equal(reference[k], got[k]) for k in reference)


def test_another_thread_drawing_mid_build_changes_nothing():
    """Thread B draws from the global RNG between thread A's two layers; A's weights stay A's."""
    between, drawn = threading.Event(), threading.Event()

    def build():
        first = nn.Linear(16, 16)
        between.set()
        assert drawn.wait(60)
        return first, nn.Linear(16, 16)

    def other():
        assert between.wait(60)
        torch.rand(10**5)
        with private_rng(9):
            torch.rand(10)  # another private block on another thread has its own stream
        drawn.set()

    with private_rng(3):
        between.set(), drawn.set()
        alone = [m.state_dict() for m in build()]
    between.clear(), drawn.clear()
    t = threading.Thread(target=other)
    t.start()
    with private_rng(3):
        crowded = [m.state_dict() for m in build()]
    t.join(60)
    for a, b in zip(alone, crowded):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_dropout_draws_from_the_private_generator():
    x = torch.ones(1000)
    with private_rng(1):
        a = nn.functional.dropout(x, 0.5, training=True)
    torch.rand(100)
    with private_rng(1):
        b = nn.functional.dropout(x, 0.5, training=True)
    assert torch.equal(a, b) and set(a.unique().tolist()) == {0.0, 2.0}
