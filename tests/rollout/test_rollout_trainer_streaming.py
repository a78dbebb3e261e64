"""The streaming trainer (rollout.trainer_micro_batches) in the simulator and the ceiling: each micro-batch is
computed once it is in and the trainer is free, priced at its own tokens; a step ends with its last micro-batch; one
micro-batch is the whole-batch trainer; no streaming run passes the proven ceiling for its trainer."""

from __future__ import annotations

import numpy as np
import pytest
from rollout_cases import job_dict

from qsync_opt.errors import SpecError
from qsync_opt.rollout.costs import micro_batch_bounds, micro_batch_seconds
from qsync_opt.rollout.sim_records import FINISH, STEP_END, STEP_START
from qsync_opt.rollout.simulate import Simulator, simulate
from qsync_opt.rollout.spec import load_rollout_spec


def _job(micro_batches=1, kinds=2, **over):
    d = job_dict(**{"rollout.trainer_micro_batches": micro_batches, **over})
    if kinds == 1:
        d["cluster"]["groups"] = d["cluster"]["groups"][:2]
        d["rollout"]["workers"] = d["rollout"]["workers"][:1]
    return load_rollout_spec(d)


@pytest.mark.parametrize("batch, m", [(32, 1), (32, 8), (30, 8), (7, 7), (5, 3)])
def test_micro_batches_split_the_batch_in_order(batch, m):
    spans = [micro_batch_bounds(batch, m, j) for j in range(m)]
    assert spans[0][0] == 0 and spans[-1][1] == batch
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    sizes = [hi - lo for lo, hi in spans]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("variant", ["partial-rollout", "repack-best-fit"])
@pytest.mark.parametrize("m", [3, 8])
def test_each_micro_batch_starts_once_in_and_the_trainer_is_free(variant, m):
    sim = Simulator(_job(m), variant)
    r = sim.run()
    B = sim.B
    assert r.steps == sim.steps_target
    ids = np.flatnonzero(~np.isnan(sim.times[:, STEP_END]))
    prev_end = 0.0
    for end in np.unique(sim.times[ids, STEP_END]):
        step = ids[sim.times[ids, STEP_END] == end]
        assert len(step) == B
        starts = np.unique(sim.times[step, STEP_START])
        assert len(starts) == m  # one start per micro-batch: the trainer computes one at a time
        sizes = [int((sim.times[step, STEP_START] == s).sum()) for s in starts]
        assert sizes == [hi - lo for lo, hi in (micro_batch_bounds(B, m, j) for j in range(m))]
        assert starts[0] >= prev_end - 1e-9
        free = None
        for j, s in enumerate(starts):
            part = step[sim.times[step, STEP_START] == s]
            last_in = sim.times[part, FINISH].max()
            assert s >= last_in - 1e-9  # never before its trajectories have finished
            if free is not None:
                assert s >= free - 1e-9
                if variant == "repack-best-fit":  # no broadcast stalls the trainer: it idles only for its input
                    assert s == pytest.approx(max(free, last_in), abs=1e-9)
            tokens = float((sim.prompts[part] + sim.targets[part]).sum())
            free = s + micro_batch_seconds(sim.train_s, tokens, m, j == m - 1)
        assert end == pytest.approx(free, abs=1e-9)  # the step ends with its last micro-batch
        prev_end = end


@pytest.mark.parametrize("variant", ["stale", "partial-rollout", "repack-best-fit"])
def test_one_micro_batch_is_the_whole_batch_trainer(variant):
    sim = Simulator(_job(1), variant)
    r = sim.run()
    ids = np.flatnonzero(~np.isnan(sim.times[:, STEP_END]))
    for end in np.unique(sim.times[ids, STEP_END]):
        step = ids[sim.times[ids, STEP_END] == end]
        assert len(np.unique(sim.times[step, STEP_START])) == 1  # the whole batch at once
        assert sim.times[step, STEP_START][0] >= sim.times[step, FINISH].max() - 1e-9
    assert r.trajectories_per_s > 0


def test_barrier_policies_train_a_round_at_once():
    for v in ("sync", "one-step-off"):
        a, b = simulate(_job(1), v), simulate(_job(8), v)
        assert a.simulated() == b.simulated()


@pytest.mark.parametrize("kinds", [1, 2])
@pytest.mark.parametrize("eta", [1, 2])
@pytest.mark.parametrize("m", [2, 8])
def test_no_streaming_run_passes_the_ceiling_for_its_trainer(kinds, eta, m):
    job = _job(m, kinds, **{"rollout.policy.eta": eta})
    for v in ("stale", "partial-rollout", "trajectory-async", "repack-best-fit"):
        r = simulate(job, v)
        assert r.trajectories_per_s <= r.ceiling_tps * (1 + 1e-9), (v, r.trajectories_per_s, r.ceiling_tps)


def test_a_step_given_in_seconds_is_split_evenly_and_bounded():
    job = _job(4, **{"rollout.trainer_step_s": 3.0})
    sim = Simulator(job, "repack-best-fit")
    r = sim.run()
    ids = np.flatnonzero(~np.isnan(sim.times[:, STEP_END]))
    end = np.unique(sim.times[ids, STEP_END])[0]
    starts = np.unique(sim.times[ids[sim.times[ids, STEP_END] == end], STEP_START])
    assert end - starts[-1] == pytest.approx(3.0 / 4)
    assert r.trajectories_per_s <= r.ceiling_tps * (1 + 1e-9)


def test_more_micro_batches_than_the_batch_names_the_field():
    with pytest.raises(SpecError, match=r"rollout\.trainer_micro_batches: 33 is more than the batch.*at most 32"):
        _job(33)
    with pytest.raises(SpecError, match=r"rollout\.trainer_micro_batches"):
        _job(0)


def test_the_plan_says_how_the_trainer_takes_its_batch(tmp_path):
    from qsync_opt.rollout.plan import RolloutPlan, solve

    plan = solve(_job(4), steps=2)
    assert plan.trainer_micro_batches == 4
    assert "streaming, 4 micro-batches a step" in plan.trainer_line()
    assert RolloutPlan.load(plan.save(tmp_path / "plan.json")).trainer_micro_batches == 4
    assert "whole batch" in solve(_job(1), steps=2).trainer_line()


def test_a_step_under_a_millisecond_is_priced_as_given():
    # a tiny model's datasheet step (rollout_cpu_tiny's is microseconds): no floor added to the trainer's own price
    def tiny(tokens):
        return 2e-7 * tokens

    assert micro_batch_seconds(tiny, 100, 1, True) == tiny(100)
    assert micro_batch_seconds(tiny, 100, 4, False) == tiny(100)
