"""rollout.bounds_staleness: the ceiling that counts the staleness rule is proven (no simulated policy passes it, at the
spec's caps, a chosen cap and a kind's own cap; its latency line and its lines per decode batch lie under every decode
step), never above the ceiling without the rule, never looser than the room program without the tie between a token's
work and its latency, strictly tighter by hand and where the room binds, and equal to the ceiling without the rule
where the rule leaves room (η large)."""

from __future__ import annotations

import numpy as np
import pytest

from qsync_opt.rollout import bounds, bounds_staleness
from qsync_opt.rollout.admission import with_cap, with_kind_cap
from qsync_opt.rollout.bounds import Plane
from qsync_opt.rollout.costs import all_worker_costs
from qsync_opt.rollout.sim_workload import draw
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


def _uncoupled_room_s(job, consumed, drawn, eta):
    """The room program without the tie (its batch-free rows only): the room bound before it."""
    arr = np.asarray(consumed, dtype=float).reshape(-1, 2)
    kinds = all_worker_costs(job)
    min_ctx = float(min(arr[:, 0].min(), np.min(drawn[0])))
    rooms = bounds_staleness.room_kinds(job, kinds, arr[:, 0], arr[:, 1], min_ctx)
    trainer_s = bounds.run_ceiling(job, arr).trainer_s
    return bounds_staleness.room_seconds(rooms, arr[:, 0], arr[:, 1], trainer_s, eta, job.rollout.workload.batch,
                                         coupled=False)


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
        # never looser than the room program without the tie
        assert c.window_s >= _uncoupled_room_s(job, sim.consumed, (sim.prompts, sim.targets), sim.eta) * (1 - 1e-9)


@pytest.mark.parametrize("kinds", [1, 2])
def test_no_simulated_policy_passes_the_staleness_ceiling_at_eta_1(kinds):
    _check_runs(_job(kinds, 1), VARIANTS)


@pytest.mark.parametrize("kinds", [1, 2])
@pytest.mark.parametrize("eta", [2, 4])
def test_no_simulated_policy_passes_the_staleness_ceiling(kinds, eta):
    _check_runs(_job(kinds, eta), VARIANTS)


@pytest.mark.parametrize("caps", [(8, None), (16, ("l4", 2))], ids=["chosen-cap-8", "l4-own-cap-2"])
@pytest.mark.parametrize("eta", [1, 2])
def test_no_simulated_policy_passes_it_at_the_caps_choose_cap_makes(caps, eta):
    """The fleet cap the planner may choose below the spec's, and a slower kind's own cap (which the tie's batches
    range up to): every policy stays under the ceiling at those caps."""
    job = with_cap(_job(2, eta), caps[0])
    if caps[1]:
        job = with_kind_cap(job, *caps[1])
    _check_runs(job, VARIANTS)


def test_the_lines_per_batch_lie_under_every_decode_step():
    """Both kinds of the small job, and an H100 up to batch 512, where the cost model's second line takes over at
    short contexts (so both of its lines are exercised)."""
    d = job_dict(**{"rollout.repack.batch_cap": 512})
    d["cluster"]["groups"].append({"name": "h100", "device": "H100-SXM", "count": 2})
    d["rollout"]["workers"].append({"group": "h100", "bits": 16})
    job = load_rollout_spec(d)
    second = False
    for c in all_worker_costs(job):
        cap = 512 if c.group == "h100" else 32
        bl = bounds_staleness.batch_lines(c, cap, 300.0)
        assert bl.cap == cap and np.all(bl.mu_s >= 0)
        for b in range(1, cap + 1):
            _, b1, _, b2 = c.decode_lines(b)
            second |= bool(np.isclose(bl.mu_s[b - 1] * 1e3, b2) and b1 != b2)
            for s in np.geomspace(b, b * 2e5, 25):
                assert c.decode_ms(b, s) / 1e3 >= (bl.f_s[b - 1] + bl.mu_s[b - 1] * s) * (1 - 1e-12), (c.group, b, s)
    assert second


def test_an_interval_prices_a_token_at_most_as_any_batch_in_it():
    job = _job(1, 1, **{"rollout.repack.batch_cap": 64})
    bl = bounds_staleness.batch_lines(all_worker_costs(job)[0], 64, 800.0)
    ctx = np.array([256.0, 1000.0, 4000.0])
    ivals = bounds_staleness.batch_intervals(64)
    assert ivals[0] == (1, 1) and ivals[-1][1] == 64
    assert [lo for lo, _ in ivals[1:]] == [hi + 1 for _, hi in ivals[:-1]]  # they cover 1..cap, in order
    assert bounds_staleness.batch_intervals(64, 1.0) == [(b, b) for b in range(1, 65)]
    for lo, hi in ivals:
        work, room = bounds_staleness.interval_prices(bl, lo, hi, ctx)
        for b in range(lo, hi + 1):
            f, mu = bl.f_s[b - 1], bl.mu_s[b - 1]
            assert np.all(work <= f / b + mu * ctx + 1e-15) and np.all(room <= f + mu * b * ctx + 1e-15)


def test_the_tie_is_strictly_tighter_by_hand():
    """One kind of 2 workers, a step of B ≤ 2 sequences lasting 1 + 0.5·(B − 1) s whatever the contexts; 64 tokens
    (two trajectories of 32), batches of 2, η = 1, the trainer's steps 10 s in all, prefills free.
    Without the tie: the plane prices a token at 0.75 s of work (its best batch, 2) and the latency line at 1 s in
    the room (its best, 1): R ≥ max(10, 0.75·64 / 2 = 24, (64 + 2·10) / 4 = 21) = 24.
    With it, x tokens at B = 1, 64 − x at B = 2: work (x + 0.75·(64 − x)) / 2 = 24 + x/8 ≤ R, room
    (x + 1.5·(64 − x) + 20) / 4 = 29 − x/8 ≤ R; the least R is at x = 20: R = 26.5."""
    kind = bounds_staleness.RoomKind(2, Plane(0.75, 0.0, 0.0), bounds_staleness.LatencyLine(1.0, 0.0, 0.0),
                                     bounds_staleness.BatchLines(np.array([1.0, 1.5]), np.zeros(2)))
    prompts, lengths = np.full(2, 256.0), np.full(2, 32.0)
    loose = bounds_staleness.room_seconds([kind], prompts, lengths, 10.0, 1, 2, coupled=False)
    tight = bounds_staleness.room_seconds([kind], prompts, lengths, 10.0, 1, 2)
    assert loose == pytest.approx(24.0, rel=1e-5)
    assert tight == pytest.approx(26.5, rel=1e-5)


@pytest.mark.parametrize("kinds", [1, 2])
def test_the_tie_tightens_the_ceiling_where_the_room_binds(kinds):
    """At η = 2 the small job's room binds: the tie lowers the ceiling below the gate's and the untied room's, and a
    finer batch grid only tightens it (each interval is priced at its best batch)."""
    job = _job(kinds, 2)
    c = bounds_staleness.staleness_ceiling(job)
    r = job.rollout
    prompts, lengths = draw(job, r.steps, 2, r.seed)
    n = r.steps * r.workload.batch
    prompts, lengths = prompts[:n].astype(float), lengths[:n].astype(float)
    rooms = bounds_staleness.room_kinds(job, all_worker_costs(job), prompts, lengths, float(prompts.min()))
    args = (rooms, prompts, lengths, c.base.trainer_s, 2, r.workload.batch)
    loose = bounds_staleness.room_seconds(*args, coupled=False)
    exact = bounds_staleness.room_seconds(*args, ratio=1.0)
    assert c.window_s == pytest.approx(bounds_staleness.room_seconds(*args), rel=1e-9)
    assert c.window_s > max(loose, c.gate_s, c.base.trainer_s, c.base.rollout_s) * 1.02
    assert exact >= c.window_s * (1 - 1e-9)


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
