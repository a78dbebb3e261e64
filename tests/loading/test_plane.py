"""The central data plane: the mix follows the weight schedule, the split is the balancer's,
and the globally normalised loss
gives the single-process gradient on 2 simulated ranks. (Resume after kill -9:
test_diff_checkpoint.py.)"""

from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qsync_opt.loading import collate
from tests.loading.plane_cases import make_plane


def test_mix_follows_schedule():
    plane = make_plane()
    first = plane.next_batch()
    assert all(s == 0 for s, _ in first.samples)  # long has weight 0 at step 0
    counts = Counter()
    for _ in range(30):
        plan = plane.next_batch()
        if plan.step >= 10:
            counts.update(s for s, _ in plan.samples)
    share = counts[1] / sum(counts.values())
    assert abs(share - 0.25) < 1 / 16  # weights 3:1 once the schedule is flat


def test_each_source_is_a_permutation_per_epoch():
    """Every epoch of a source is a permutation: over any prefix of the stream, sample counts
    differ by at most one (the per-step shuffle reorders slots, not which samples)."""
    plane = make_plane(global_batch=50)
    seen = Counter()
    for _ in range(30):
        seen.update(i for s, i in plane.next_batch().samples if s == 1)
        full = plane.epoch[1]
        counts = [seen[i] for i in range(97)]
        assert max(counts) - min(counts) <= 1 and min(counts) >= full
    assert plane.epoch[1] >= 2


def test_ranks_partition_the_batch_and_balance():
    plane = make_plane()
    for _ in range(12):
        plan = plane.next_batch()
        ids = plan.rank_ids(0) + plan.rank_ids(1)
        assert sorted(ids) == sorted(plan.samples)
    stride = plane.assign(plan.lengths, "stride")
    ours = plane.assign(plan.lengths, "ours")
    assert max(ours.predicted) <= max(stride.predicted)
    assert max(ours.predicted) <= max(plane.assign(plan.lengths, "verl-kk").predicted)


class TinyLM(nn.Module):
    def __init__(self, vocab=32, d=16, heads=2):
        super().__init__()
        self.emb, self.heads = nn.Embedding(vocab, d), heads
        self.qkv, self.proj, self.head = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, vocab)

    def forward(self, ids, mask):
        x = self.emb(ids)
        B, L, d = x.shape
        q, k, v = (t.view(B, L, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        attn = causal[None, None] & mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn).transpose(1, 2).reshape(B, L, d)
        return self.head(x + self.proj(y))


def test_global_normalisation_matches_single_process():
    torch.manual_seed(0)
    model = TinyLM().double()
    plane = make_plane(global_batch=10, backend=None)
    for _ in range(11):
        plan = plane.next_batch()  # step 10: both sources
    rng = np.random.default_rng(1)
    samples = [torch.from_numpy(rng.integers(0, 32, L)) for L in plan.lengths]
    n_targets = collate.target_count(plan.lengths)

    def grads(idx):
        model.zero_grad()
        ids, mask = collate.pad([samples[i] for i in idx])
        loss = collate.normalised_loss(collate.lm_loss_sum(model(ids, mask), ids, mask), n_targets)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    single = grads(list(range(len(samples))))
    per_rank = [grads(plan.rank_slots(r)) for r in range(2)]
    assert len(plan.rank_slots(0)) != len(plan.rank_slots(1))  # unequal counts: where per-rank means go wrong
    for g, a, b in zip(single, *per_rank):
        torch.testing.assert_close(a + b, g, rtol=1e-10, atol=1e-12)
    # the per-rank mean (what a plain DDP average does) is not the same gradient
    model.zero_grad()
    naive = []
    for r in range(2):
        idx = plan.rank_slots(r)
        ids, mask = collate.pad([samples[i] for i in idx])
        model.zero_grad()
        (collate.lm_loss_sum(model(ids, mask), ids, mask) / collate.target_count([plan.lengths[i] for i in idx]) / 2).backward()
        naive.append([p.grad.clone() for p in model.parameters()])
    assert not all(torch.allclose(a + b, g) for g, a, b in zip(single, *naive))


def test_state_mismatch_is_refused():
    plane = make_plane()
    plane.next_batch()
    state = plane.state_dict()
    other = make_plane(seed=4)
    with pytest.raises(Exception, match="mix_seed"):
        other.load_state_dict(state)
