"""rollout.admission: the planner's choice of the batch cap, and the plan made at it."""

from __future__ import annotations

import pytest
from rollout_cases import job_dict

from qsync_opt.rollout.admission import (
    CHOOSE_TIE_FRAC,
    cap_candidates,
    choose_cap,
    choose_kind_caps,
    planned_job,
    rule_share,
    slower_groups,
    with_cap,
    with_kind_cap,
)
from qsync_opt.rollout.plan import solve
from qsync_opt.rollout.simulate import simulate
from qsync_opt.rollout.spec import load_rollout_spec

# 8 prompts x 4 = 32 trajectories a step on 8 rollouts at η = 1: the rule's room is 8 per rollout
PARTIAL_CAP64 = {"rollout.policy": {"kind": "partial-rollout"}, "rollout.repack.batch_cap": 64}


def test_candidates_are_the_spec_cap_then_shares_of_the_rule_room_below_it():
    job = load_rollout_spec(job_dict(**PARTIAL_CAP64))
    assert rule_share(job) == pytest.approx(2 * 32 / 8)
    assert cap_candidates(job) == [64, 4, 6, 8]
    small = load_rollout_spec(job_dict(**{"rollout.repack.batch_cap": 5}))
    assert cap_candidates(small) == [5, 4]  # never above the spec's cap
    assert with_cap(job, 6).rollout.repack.batch_cap == 6
    assert job.rollout.repack.batch_cap == 64  # with_cap copies


def test_the_spec_cap_is_kept_unless_another_is_faster_beyond_the_tie():
    for over in (PARTIAL_CAP64, {}):
        job = load_rollout_spec(job_dict(**over))
        variant = job.rollout.policy.kind
        c = choose_cap(job, variant)
        assert set(c.tps) == set(cap_candidates(job))
        for cap, tps in c.tps.items():  # each figure is that cap's simulation
            assert tps == pytest.approx(simulate(with_cap(job, cap), variant).trajectories_per_s, rel=1e-12)
        if c.changed:
            assert c.tps[c.cap] == max(c.tps.values()) > (1 + CHOOSE_TIE_FRAC) * c.tps[c.spec_cap]
        else:
            assert max(c.tps.values()) <= (1 + CHOOSE_TIE_FRAC) * c.tps[c.spec_cap]


def test_a_plan_that_chooses_its_cap_is_made_at_it_and_stays_under_its_ceiling():
    d = job_dict(**PARTIAL_CAP64)
    d["rollout"]["repack"]["choose_cap"] = True
    job = load_rollout_spec(d)
    choice = choose_cap(job, "partial-rollout")
    assert choice.changed  # this job is a case where a lower cap wins (64 -> the rule's room per rollout)
    plan = solve(job, variants=("sync", "partial-rollout", "trajectory-async"), processes=1)
    assert any(f"batch_cap {choice.cap} chosen for the spec's 64" in n for n in plan.notes)
    at, notes = planned_job(job)
    assert at.rollout.repack.batch_cap == choice.cap and notes == plan.notes[-len(notes):]
    assert len(notes) == 2 and notes[1].startswith("workers l4: ")  # then the slower kind's own cap
    for p in plan.policies:
        assert p.trajectories_per_s == pytest.approx(simulate(at, p.variant).trajectories_per_s, rel=1e-12)
        assert p.trajectories_per_s <= p.ceiling_tps * (1 + 1e-9)  # the ceiling of the run at the chosen cap
    plain = solve(load_rollout_spec(job_dict(**PARTIAL_CAP64)), variants=("partial-rollout",), processes=1)
    assert not any("batch_cap" in n for n in plain.notes)  # off by default: the spec's cap, no note
    assert plan.figures("partial-rollout").trajectories_per_s > plain.figures("partial-rollout").trajectories_per_s


def test_a_kind_cap_above_the_fleet_cap_is_refused_naming_the_field():
    from qsync_opt.errors import SpecError

    d = job_dict(**{"rollout.repack.batch_cap": 16})
    d["rollout"]["workers"][1]["batch_cap"] = 32
    with pytest.raises(SpecError, match=r"rollout\.workers\.1\.batch_cap: 32 is above rollout\.repack\.batch_cap 16"):
        load_rollout_spec(d)


@pytest.mark.parametrize("variant", ["partial-rollout", "trajectory-async", "repack-best-fit"])
def test_a_kinds_own_cap_bounds_its_batches_and_its_run_stays_under_the_ceiling(variant, monkeypatch):
    from qsync_opt.rollout.simulate import Simulator

    job = with_kind_cap(load_rollout_spec(job_dict()), "l4", 2)  # the fleet's cap is 16
    assert slower_groups(job) == ["l4"]
    most: dict[str, int] = {}
    add = Simulator._add

    def counting(self, w, t):
        add(self, w, t)
        most[w.c.group] = max(most.get(w.c.group, 0), len(w.batch))

    monkeypatch.setattr(Simulator, "_add", counting)  # admissions and repack moves both place through _add
    r = simulate(job, variant)
    assert most["l4"] <= 2 and most["a100"] > 2
    assert r.trajectories_per_s <= r.ceiling_tps * (1 + 1e-9)


def test_kind_caps_are_chosen_only_for_slower_kinds_and_kept_within_the_tie():
    job = load_rollout_spec(job_dict())
    out, choices = choose_kind_caps(job, "repack-best-fit")
    assert [c.group for c in choices] == ["l4"]
    (c,) = choices
    assert set(c.tps) == {16, 1, 2, 4, 8}
    for cap, tps in c.tps.items():
        assert tps == pytest.approx(simulate(with_kind_cap(job, "l4", cap), "repack-best-fit").trajectories_per_s,
                                    rel=1e-12)
    if c.changed:
        assert c.tps[c.cap] == max(c.tps.values()) > (1 + CHOOSE_TIE_FRAC) * c.tps[16]
    else:
        assert max(c.tps.values()) <= (1 + CHOOSE_TIE_FRAC) * c.tps[16]
    assert next(w.batch_cap for w in out.rollout.workers if w.group == "l4") == (c.cap if c.changed else 16)
