"""benchmarks/rollout_redeal.py: the decode rate of a deal is the cost model's, and the segregated deal beats the even
one where a few long contexts would slow every batch they join, within each rollout's cap and KV."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import rollout_redeal as rd  # noqa: E402
from benchmarks.rollout import case_job  # noqa: E402
from qsync_opt.rollout.costs import all_worker_costs  # noqa: E402


@pytest.fixture(scope="module")
def cost():
    return all_worker_costs(case_job("h100x128", 1))[0]


def test_the_rate_of_a_deal_is_each_rollouts_batch_over_its_step(cost):
    groups = [np.array([600.0, 700.0]), np.array([5000.0]), np.array([])]
    assert rd.rate(cost, groups) == pytest.approx(2 / cost.decode_ms(2, 1300.0) + 1 / cost.decode_ms(1, 5000.0))


def test_a_few_long_contexts_kept_apart_decode_faster_than_dealt_evenly(cost):
    ctx = np.array([300_000.0] * 4 + [600.0] * 60)
    even, seg = rd.redeal(cost, 64, ctx, 4)
    assert even == pytest.approx(rd.rate(cost, rd.deal(np.sort(ctx)[::-1], 4)))
    assert seg > 1.2 * even  # the long ones kept on a rollout or two: the others decode short batches quickly
    # no deal may pass a rollout's batch cap: with a cap of 16 nothing but the even deal of 64 over 4 fits
    assert rd.redeal(cost, 16, ctx, 4) == pytest.approx((even, even))
