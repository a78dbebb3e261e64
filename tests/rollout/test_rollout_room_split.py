"""The simulator's account of the staleness rule's room: from each trajectory's admission, placement, finish and
step times it splits the room exactly (the shares add up to its fill, the rule holds at every instant, the batch in
training holds it for exactly the trainer's busy time), no trained trajectory decodes sooner than the least latency
the ceiling's gate prices it at, and the what-if at that least latency follows Little's law on the room."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from rollout_cases import job_dict

from qsync_opt.rollout.bounds_staleness import least_latencies
from qsync_opt.rollout.plan import PolicyFigures
from qsync_opt.rollout.sim_records import ADMIT, FINISH, FIRST, STEP_END, STEP_START
from qsync_opt.rollout.simulate import Simulator, simulate
from qsync_opt.rollout.spec import load_rollout_spec

STREAMING = ("stale", "partial-rollout", "trajectory-async", "repack-best-fit")


def _job(kinds: int, eta: int):
    d = job_dict(**{"rollout.policy.eta": eta})
    if kinds == 1:
        d["cluster"]["groups"] = d["cluster"]["groups"][:2]
        d["rollout"]["workers"] = d["rollout"]["workers"][:1]
    return load_rollout_spec(d)


def _most_in_room(times: np.ndarray, batch: int) -> int:
    """The most trajectories admitted and not yet trained at any instant (a step's end frees its batch before the
    admissions it opens, at the same instant)."""
    events = [(t, 1) for t in times[:, ADMIT] if not np.isnan(t)]
    events += [(t, -1) for t in times[:, STEP_END] if not np.isnan(t)]
    events.sort(key=lambda e: (e[0], e[1]))
    n = most = 0
    for _, d in events:
        n += d
        most = max(most, n)
    return most


@pytest.mark.parametrize("kinds", [1, 2])
@pytest.mark.parametrize("eta", [1, 2])
@pytest.mark.parametrize("variant", STREAMING)
def test_the_room_is_split_exactly_and_the_rule_holds_at_every_instant(kinds, eta, variant):
    job = _job(kinds, eta)
    sim = Simulator(job, variant)
    r = sim.run()
    B = job.rollout.workload.batch
    shares = (r.room_queued_mean, r.room_decoding_mean, r.gate_waiting_mean, r.room_training_mean)
    assert all(s >= 0 for s in shares)
    assert sum(shares) == pytest.approx(r.gate_fill_mean, rel=1e-12)
    assert _most_in_room(sim.times, B) <= (eta + 1) * B  # AReaL's rule: admitted − trained ≤ (η + 1)·batch
    assert 0 < r.gate_fill_mean <= 1
    # the batch in training holds the room for exactly the trainer's busy time, counted apart by the trainer
    busy_s = (1 - r.trainer_idle_frac) * r.sim_time_s
    assert r.room_training_mean * r.sim_time_s * (eta + 1) * B == pytest.approx(B * busy_s, rel=1e-9)
    # every trained trajectory went through its phases in order
    done = sim.times[~np.isnan(sim.times[:, STEP_END])]
    assert len(done) == r.steps * B
    assert (np.diff(done[:, [ADMIT, FIRST, FINISH, STEP_START, STEP_END]], axis=1) >= 0).all()


@pytest.mark.parametrize("kinds", [1, 2])
@pytest.mark.parametrize("variant", STREAMING)
def test_no_trained_trajectory_decodes_sooner_than_the_gate_prices_it(kinds, variant):
    job = _job(kinds, 1)
    sim = Simulator(job, variant)
    r = sim.run()
    done = ~np.isnan(sim.times[:, STEP_END])
    least = least_latencies(job, (sim.prompts, sim.targets), sim.kinds)[:len(done)][done]
    latency = sim.times[done, FINISH] - sim.times[done, FIRST]
    assert (latency >= least * (1 - 1e-9)).all()
    assert r.latency_stretch >= 1
    assert r.latency_s_mean == pytest.approx(latency.mean())


def test_the_what_if_at_the_least_latency_follows_littles_law_on_the_room():
    r = simulate(_job(2, 1), "repack-best-fit")
    assert r.latency_stretch > 1.05  # the tiny job's rollouts batch: its tokens decode slower than alone
    assert r.at_least_latency_tps() > r.trajectories_per_s
    assert dataclasses.replace(r, latency_stretch=1.0).at_least_latency_tps() == pytest.approx(r.trajectories_per_s)
    # by hand: nothing queued, decoding 40%, waiting 25%, training 30% of the room; decoding twice the least latency.
    # At the same fill each trajectory holds the room 0.2 + 0.3 of the run's room-seconds per trajectory instead of
    # 0.4 + 0.3, the wait staying the same share of the step period: 0.7 / 0.5 = 1.4 times the throughput
    hand = dataclasses.replace(r, room_queued_mean=0.0, room_decoding_mean=0.4, gate_waiting_mean=0.25,
                               room_training_mean=0.3, gate_fill_mean=0.95, latency_stretch=2.0)
    assert hand.at_least_latency_tps() == pytest.approx(1.4 * r.trajectories_per_s)


@pytest.mark.parametrize("variant", ["sync", "one-step-off"])
def test_the_barrier_policies_have_no_room_split(variant):
    r = simulate(_job(1, 1), variant)
    assert r.gate_fill_mean is None and r.room_decoding_mean is None and r.latency_stretch is None
    assert r.at_least_latency_tps() is None


def test_the_plan_says_where_the_room_went():
    r = simulate(_job(2, 1), "repack-best-fit")
    line = PolicyFigures.of(r).room_line()
    assert f"{r.gate_fill_mean:.0%} in use" in line and f"{r.gate_waiting_mean:.0%} finished and waiting" in line
    assert f"{r.latency_stretch:.2f}x slower" in line
    assert PolicyFigures.of(simulate(_job(1, 1), "sync")).room_line() is None
