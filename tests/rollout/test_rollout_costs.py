"""Rollout costs come from the serving cost model: the line form of t(B, ΣL) equals direct calls."""

from __future__ import annotations

import random

import pytest
from rollout_cases import job_dict

from qsync_opt.llm import costs as sc
from qsync_opt.rollout.costs import (
    all_worker_costs,
    migration_s,
    sync_costs,
    trainer_step_s,
)
from qsync_opt.rollout.spec import load_rollout_spec


@pytest.fixture(scope="module")
def job():
    return load_rollout_spec(job_dict())


def test_decode_lines_match_serving_model(job):
    rng = random.Random(0)
    for c in all_worker_costs(job):
        for _ in range(300):
            b = rng.randint(1, 200)
            s = b * rng.uniform(1, 30000)
            assert c.decode_ms(b, s) == pytest.approx(c.decode_ms_direct(b, s), rel=1e-8)


def test_decode_is_serving_layers_times_layer(job):
    c = all_worker_costs(job)[0]
    cfg = job.rollout.model
    w = sc.Workload(prompt_len=1000, gen_tokens=0, global_batch=8)
    dev = job.cluster.groups[1].device_spec
    want = cfg.get("layers") * sc.decode_layer_ms(cfg, w, dev, 16, 8) + sc.head_ms(cfg, w, dev, 8, "decode")
    assert c.decode_ms(8, 8000) == pytest.approx(want, rel=1e-9)


def test_throughput_concave_in_batch(job):
    c = all_worker_costs(job)[0]
    rates = [b / c.decode_ms(b, b * 2000) for b in (1, 2, 4, 8, 16, 32, 64)]
    assert all(r2 > r1 for r1, r2 in zip(rates, rates[1:]))
    gains = [r2 / r1 for r1, r2 in zip(rates, rates[1:])]
    assert all(g2 <= g1 + 1e-9 for g1, g2 in zip(gains, gains[1:]))  # diminishing returns


def test_lower_bits_decode_faster_and_hold_more_kv(job):
    c16, c8 = all_worker_costs(job)[0], all_worker_costs(load_rollout_spec(job_dict(**{
        "rollout.workers": [{"group": "a100", "bits": 8}, {"group": "l4", "bits": 8}]})))[0]
    assert c8.kv_capacity_tokens > c16.kv_capacity_tokens
    assert c8.weight_bytes < c16.weight_bytes
    assert c8.pull_s < c16.pull_s


def test_migration_takes_the_cheaper_way(job):
    c = all_worker_costs(job)[0]
    sync = sync_costs(job)
    for ctx in (100, 10000):
        s, how = migration_s(ctx, c, sync)
        reprefill = c.prefill_ms(1, ctx) / 1e3
        kv = sync.kv_link_latency_s + ctx * c.kv_bytes_per_token / (sync.kv_link_gbs * 1e9)
        assert s == pytest.approx(min(reprefill, kv)) and how == ("reprefill" if reprefill <= kv else "kv")


def test_relay_stalls_trainer_no_longer_than_broadcast(job):
    s = sync_costs(job)
    assert 0 < s.push_s <= s.broadcast_s
    assert trainer_step_s(job, 2e5) == pytest.approx(2 * trainer_step_s(job, 1e5))


def test_ragged_prefill_prices_attention_at_the_sum_of_squares(job):
    """A re-prefill of interrupted trajectories is one micro-batch of long-tailed contexts: the serving model's
    attention FLOPs are 4·h·Σ L² per layer, so pricing it as m sequences of the mean length undercounts it."""
    cfg = job.rollout.model
    for c in all_worker_costs(job):
        assert c.prefill_set_ms([700] * 5) == pytest.approx(c.prefill_ms(5, 700), rel=1e-12)  # equal: the same
        ls = [300, 400, 600, 9000, 14000]  # a tail
        mean = sum(ls) / len(ls)
        dev = next(g.device_spec for g in job.cluster.groups if g.name == c.group)
        w = sc.Workload(prompt_len=mean, gen_tokens=0, global_batch=len(ls))
        want = (cfg.get("layers") * sc.prefill_layer_ms_lengths(cfg, dev, c.bits, sum(ls), sum(x * x for x in ls))
                + sc.head_ms(cfg, w, dev, len(ls), "prefill"))
        assert c.prefill_set_ms(ls) == pytest.approx(want, rel=1e-12)
        # compute-bound here: the excess over the mean-length price is exactly the attention the mean misses
        fp16 = dev.achieved_flops("fp16")
        missed = cfg.get("layers") * 4 * cfg.get("hidden") * (sum(x * x for x in ls) - len(ls) * mean ** 2) / fp16
        assert c.prefill_set_ms(ls) - c.prefill_ms(len(ls), mean) == pytest.approx(1e3 * missed, rel=1e-3)
        assert missed > 0


def test_serving_prefill_layer_is_the_ragged_form_at_equal_lengths(job):
    cfg = job.rollout.model
    dev = job.cluster.groups[1].device_spec
    for bits in (4, 8, 16):
        for s, mb in ((128, 1), (1000, 8), (4096, 3)):
            w = sc.Workload(prompt_len=s, gen_tokens=0, global_batch=mb)
            assert sc.prefill_layer_ms(cfg, w, dev, bits, mb) == sc.prefill_layer_ms_lengths(
                cfg, dev, bits, mb * s, mb * s * s)
