"""The real trainer's streaming step: the gradient accumulated micro-batch by micro-batch is the whole batch's, and
so is the step it takes (TrainerActor, no Ray needed)."""

from __future__ import annotations

import numpy as np
import pytest

from qsync_opt.rollout.actors import TrainerActor

CFG = {"hidden": 32, "heads": 4, "layers": 2, "ffn": 64, "vocab": 50, "max_ctx": 64}


def _batch(seed=0, n=12):
    rng = np.random.RandomState(seed)
    plens = rng.randint(2, 8, n).tolist()
    seqs = [rng.randint(0, CFG["vocab"], p + int(rng.randint(1, 40))).tolist() for p in plens]
    return seqs, plens


def _grads(t):
    return [p.grad.detach().clone() for p in t.model.parameters()]


@pytest.mark.parametrize("cuts", [[12], [3, 6, 9, 12], [1, 2, 12], [5, 12]])
def test_micro_batches_give_the_whole_batchs_gradient_and_step(cuts):
    seqs, plens = _batch()
    whole, parts = TrainerActor(CFG, 0, reward_ref=20.0), TrainerActor(CFG, 0, reward_ref=20.0)
    whole._backward(seqs, plens)
    lo = 0
    for hi in cuts:
        parts._backward(seqs[lo:hi], plens[lo:hi])
        lo = hi
    assert parts.acc_tokens == whole.acc_tokens == sum(len(s) - p for s, p in zip(seqs, plens))
    assert parts.acc_loss == pytest.approx(whole.acc_loss, rel=1e-5)
    for a, b in zip(_grads(whole), _grads(parts)):
        # float32 sums in another order and over other paddings: within 1e-5 of the largest gradient entry
        assert (a - b).abs().max() <= 1e-5 * max(a.abs().max(), 1e-12)
    assert whole._apply() == pytest.approx(parts._apply(), rel=1e-5)
    assert whole.version == parts.version == 1
    for (k, a), b in zip(whole.model.state_dict().items(), parts.model.state_dict().values()):
        assert (a - b).abs().max() <= 1e-6, k  # AdamW's first step moves each weight by at most lr


def test_the_step_resets_what_it_accumulated():
    seqs, plens = _batch()
    t = TrainerActor(CFG, 0, reward_ref=20.0)
    t._backward(seqs, plens)
    t._apply()
    assert t.acc_tokens == 0 and t.acc_loss == 0
    assert all(p.grad is None for p in t.model.parameters())


def test_the_advantage_is_per_trajectory():
    t = TrainerActor(CFG, 0, reward_ref=20.0)
    adv = t.advantage([10, 20, 40])
    assert adv.tolist() == pytest.approx([np.log(0.5), 0.0, np.log(2.0)])
    assert t.advantage([40]).tolist() == pytest.approx([np.log(2.0)])  # nothing from the rest of the batch
