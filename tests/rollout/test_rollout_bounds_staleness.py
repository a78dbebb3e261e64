"""rollout.bounds_staleness: the ceiling that counts the staleness rule is proven (no simulated policy passes it, its
latency line lies under every decode step), never above the ceiling without the rule, and equal to it where the rule
leaves room (η large)."""

from __future__ import annotations

import numpy as np
import pytest

from qsync_opt.rollout import bounds, bounds_staleness
from qsync_opt.rollout.costs import all_worker_costs
from qsync_opt.rollout.simulate import VARIANTS, Simulator
from qsync_opt.rollout.spec import load_rollout_spec
from rollout_cases import job_dict


def _job(kinds: int, eta: int, **over):
    d = job_dict(**over)
    d["rollout"]["policy"]["eta"] = eta
    if kinds == 1:
        d["cluster"]["groups"] = d["cluster"]["groups"][:2]
        d["rollout"]["workers"] = d["rollout"]["workers"][:1]
    return load_rollout_spec(d)


def test_the_latency_line_lies_under_every_decode_step():
    job = _job(2, 1)
    cap, p_min = job.rollout.repack.batch_cap, 256
    for c in all_worker_costs(job):
        ln = bounds_staleness.latency_line(c, cap, p_min, 1e5, 1e5 * 1500)
        assert ln.lambda_s > 0 and ln.mu_s >= 0
        for b in range(1, cap + 1):
            for ctx in np.geomspace(p_min, 2e5, 30):
                s = ctx + b - 1  # the others hold a token each at least
                assert c.decode_ms(b, s) / 1e3 >= (ln.lambda_s + ln.mu_s * ctx) * (1 - 1e-12), (c.group, b, ctx)
        assert all(c.prefill_ms(m, p_min) / 1e3 >= ln.prefill_s * (1 - 1e-12) for m in range(1, cap + 1))


def _check_runs(job, variants):
    for v in variants:
        sim = Simulator(job, v)
        r = sim.run()
        c = bounds_staleness.staleness_run_ceiling(job, sim.consumed, (sim.prompts, sim.targets), sim.eta)
        assert c.proven, c.note
        assert r.trajectories_per_s <= c.tps * (1 + 1e-9), (v, job.rollout.policy.eta, r.trajectories_per_s, c)
        # the run's own figure is the same bound
        assert r.ceiling_tps == pytest.approx(c.tps, rel=1e-9)
        assert c.tps <= c.base.tps * (1 + 1e-12)


@pytest.mark.parametrize("kinds", [1, 2])
def test_no_simulated_policy_passes_the_staleness_ceiling_at_eta_1(kinds):
    _check_runs(_job(kinds, 1), VARIANTS)


@pytest.mark.parametrize("kinds", [1, 2])
@pytest.mark.parametrize("eta", [2, 4])
def test_no_simulated_policy_passes_the_staleness_ceiling(kinds, eta):
    _check_runs(_job(kinds, eta), VARIANTS)


def test_a_long_tail_at_eta_1_binds_where_the_ceiling_without_the_rule_does_not():
    """A tail far longer than a trainer step: the rule binds, and a larger η loosens it."""
    tight = bounds_staleness.staleness_ceiling(_job(1, 1))
    loose = bounds_staleness.staleness_ceiling(_job(1, 4))
    assert tight.bound_by == "staleness rule" and tight.tps < tight.base.tps
    assert tight.tps <= loose.tps <= loose.base.tps * (1 + 1e-12)


@pytest.mark.parametrize("kinds", [1, 2])
def test_it_is_the_ceiling_without_the_rule_when_eta_is_large(kinds):
    job = _job(kinds, 64)
    c = bounds_staleness.staleness_ceiling(job)
    assert c.proven
    assert c.tps == pytest.approx(bounds.ceiling(job).tps, rel=1e-6)
    assert c.bound_by == bounds.ceiling(job).bound_by


@pytest.mark.parametrize("kinds", [1, 2])
@pytest.mark.parametrize("eta", [1, 2, 4])
def test_it_never_exceeds_the_ceiling_without_the_rule(kinds, eta):
    job = _job(kinds, eta)
    assert bounds_staleness.staleness_ceiling(job).tps <= bounds.ceiling(job).tps * (1 + 1e-12)


def test_the_gate_recursion_waits_for_the_first_batch_and_each_cohort(monkeypatch):
    """By hand: batch 2, η = 1, steps of 1 s, a latency of `length` seconds; cohorts of lengths 1, 5 | 2, 3 | 1, 1 |
    1, 1. Cohorts 0 and 1 open at 0 (finishes 1, 5, 2, 3): step 1 starts at 2 and ends at 3, opening cohort 2 (4, 4).
    Step 2 needs four finished (1, 2, 3, 4): starts at 4, ends at 5, opening cohort 3 (6, 6). Step 3 needs six: the
    sixth is 5, so it starts at 5 and ends at 6."""
    monkeypatch.setattr(bounds_staleness, "latency_line", lambda *a, **k: bounds_staleness.LatencyLine(1.0, 0.0, 0.0))
    d = job_dict()
    d["rollout"]["workload"].update(prompts_per_step=1, group_size=2)
    lengths = np.array([1, 5, 2, 3, 1, 1, 1, 1], dtype=float)
    end, first = bounds_staleness.gate_seconds(load_rollout_spec(d), (np.full(8, 256.0), lengths), [1.0] * 3, 1,
                                               costs=[object()])
    assert (end, first) == (6.0, 2.0)
