"""rollout.bounds: the ceilings are proven, so no simulated policy may pass them and the plane must lie under the cost
model everywhere on its domain."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from qsync_opt.rollout import bounds
from qsync_opt.rollout.costs import all_worker_costs
from qsync_opt.rollout.simulate import VARIANTS, Simulator
from qsync_opt.rollout.spec import load_rollout_spec
from rollout_cases import job_dict


@pytest.fixture(scope="module")
def job():
    return load_rollout_spec(job_dict())


@pytest.fixture(scope="module")
def one_kind():
    d = job_dict()
    d["cluster"]["groups"] = d["cluster"]["groups"][:2]
    d["rollout"]["workers"] = d["rollout"]["workers"][:1]
    return load_rollout_spec(d)


def test_the_plane_lies_under_every_decode_step_and_touches_it(job):
    cap, p_min = job.rollout.repack.batch_cap, 256
    for c in all_worker_costs(job):
        pl = bounds.decode_plane(c, cap, p_min, 1e5, 1e5 * 1500)
        worst = min((c.decode_ms(b, s) / 1e3 - (pl.alpha_s * b + pl.beta_s * s)) / (c.decode_ms(b, s) / 1e3)
                    for b in range(1, cap + 1) for s in np.geomspace(b * p_min, b * 2e5, 40))
        assert worst >= -1e-9, f"{c.group}: the plane is above the step time by {-worst:.2e}"
        assert worst <= 1e-6, f"{c.group}: the plane never touches the step time (slack {worst:.2e})"
        # and under the serving model itself, not only under the lines fitted to it
        for b, s in itertools.product((1, 3, cap), (b * p_min for b in (1, 3, cap))):
            assert c.decode_ms_direct(b, s) / 1e3 >= pl.alpha_s * b + pl.beta_s * s - 1e-12


def test_a_prefill_costs_at_least_the_cheapest_per_sequence_price(job):
    rng = np.random.default_rng(0)
    for c in all_worker_costs(job):
        pl = bounds.decode_plane(c, 16, 256, 1e5, 1e5 * 1500)
        for _ in range(50):
            ls = rng.integers(256, 4000, size=int(rng.integers(1, 17))).tolist()
            assert c.prefill_set_ms(ls) / 1e3 >= len(ls) * pl.prefill_s * (1 - 1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_simulated_policy_passes_its_run_ceiling(job, one_kind, variant):
    for j in (job, one_kind):
        sim = Simulator(j, variant)
        r = sim.run()
        c = bounds.run_ceiling(j, sim.consumed)
        assert len(sim.consumed) == j.rollout.steps * j.rollout.workload.batch
        assert r.trajectories_per_s <= c.tps * (1 + 1e-9), (variant, r.trajectories_per_s, c)
        # the rollouts alone: the run's worker-seconds cover the decode and prefill the plane prices
        assert r.sim_time_s >= c.rollout_s * (1 - 1e-9)


def test_one_kind_split_in_two_gives_the_same_ceiling(one_kind):
    """The multi-kind program against the closed form: the same fleet as two groups of one device."""
    d = job_dict()
    d["cluster"]["groups"] = [d["cluster"]["groups"][0], {"name": "a", "device": "A100-80GB", "count": 4},
                              {"name": "b", "device": "A100-80GB", "count": 2}]
    d["rollout"]["workers"] = [{"group": "a", "bits": 16}, {"group": "b", "bits": 16}]
    split = load_rollout_spec(d)
    sim = Simulator(one_kind, "sync")
    n = sim.steps_target * sim.B
    prompts, lengths = sim.prompts[:n], sim.targets[:n]
    closed = bounds.rollout_seconds(one_kind, prompts, lengths)
    lp = bounds.rollout_seconds(split, prompts, lengths)
    # the program prices each context group at its lowest context: at most BUCKET_TOKENS of context per token lower
    assert closed * 0.97 <= lp <= closed * (1 + 1e-6)


def test_the_fleet_beats_each_kind_alone(job):
    sim = Simulator(job, "sync")
    n = sim.steps_target * sim.B
    both = bounds.rollout_seconds(job, sim.prompts[:n], sim.targets[:n])
    alone = [bounds.rollout_seconds(job, sim.prompts[:n], sim.targets[:n], costs=[c]) for c in all_worker_costs(job)]
    # each kind alone is one split of the program's: the fleet is faster than either kind at its own count
    assert both < min(alone)


def test_the_long_run_ceiling_names_its_binding_side(job):
    c = bounds.ceiling(job)
    assert c.tps == min(c.trainer_tps, c.rollout_tps)
    assert c.bound_by == ("trainer" if c.trainer_tps <= c.rollout_tps else "rollouts")
    more_trainers = job_dict()
    more_trainers["cluster"]["groups"][0]["count"] = 64
    c2 = bounds.ceiling(load_rollout_spec(more_trainers))
    assert c2.trainer_tps > c.trainer_tps and c2.rollout_tps == pytest.approx(c.rollout_tps)


def test_the_plan_reports_its_ceiling_and_each_run_lies_under_its_own(job):
    from rich.console import Console

    from qsync_opt.rollout.bounds_staleness import staleness_ceiling
    from qsync_opt.rollout.plan import RolloutPlan, solve
    from qsync_opt.rollout.report import print_plan

    plan = solve(job, processes=1)
    c = staleness_ceiling(job)
    assert plan.ceiling.trajectories_per_s == pytest.approx(c.tps)
    assert plan.ceiling.bound_by == c.bound_by and plan.ceiling.eta == c.eta
    assert plan.ceiling.without_rule_tps == pytest.approx(bounds.ceiling(job).tps)
    for p in plan.policies:
        assert p.ceiling_tps is not None and p.trajectories_per_s <= p.ceiling_tps * (1 + 1e-9), p.variant
    assert RolloutPlan.model_validate_json(plan.to_json()) == plan
    console = Console(record=True, width=250)
    print_plan(plan, console)
    text = console.export_text()
    assert f"ceiling: {c.tps:.2f} traj/s (proven, any policy, staleness η={c.eta}, long run)" in text
    # the rule binds on this job's long tail: the ceiling without it stays in view
    assert c.tps < bounds.ceiling(job).tps
    assert f"without the staleness rule: {bounds.ceiling(job).tps:.2f} traj/s" in text
    assert "of ceiling" in text
