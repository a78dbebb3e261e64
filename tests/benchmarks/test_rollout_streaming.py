"""benchmarks/rollout_streaming.py: with one micro-batch a step the streaming trainer is today's whole-batch trainer,
figure for figure, and with more it never ends a step before the whole batch is in."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))

from rollout_cases import job_dict  # noqa: E402

from benchmarks import rollout_streaming as rs  # noqa: E402
from qsync_opt.rollout.sim_records import FINISH, STEP_END  # noqa: E402
from qsync_opt.rollout.simulate import simulate  # noqa: E402
from qsync_opt.rollout.spec import load_rollout_spec  # noqa: E402


@pytest.fixture(scope="module")
def job():
    return load_rollout_spec(job_dict())


@pytest.mark.parametrize("variant", ["partial-rollout", "repack-best-fit"])
def test_one_micro_batch_is_the_whole_batch_trainer(job, variant):
    assert rs.StreamingTrainer(job, variant, 1).run().simulated() == simulate(job, variant).simulated()


def test_no_step_ends_before_its_last_micro_batch_nor_within_its_compute_of_the_last(job):
    mb = 4
    sim = rs.StreamingTrainer(job, "repack-best-fit", mb)
    r = sim.run()
    assert r.steps == job.rollout.steps
    ids = np.flatnonzero(~np.isnan(sim.times[:, STEP_END]))
    prev = 0.0
    for end in np.unique(sim.times[ids, STEP_END]):
        batch = ids[sim.times[ids, STEP_END] == end]
        assert len(batch) == job.rollout.workload.batch
        t = sim.train_s(float((sim.prompts[batch] + sim.targets[batch]).sum()))
        assert end >= sim.times[batch, FINISH].max() + t / mb - 1e-9  # its last micro-batch, after the last finish
        assert end >= prev + t - 1e-9  # one trainer: the step's whole compute after the previous step's end
        prev = end


@pytest.mark.parametrize("kinds", [1, 2])
@pytest.mark.parametrize("eta", [1, 2])
@pytest.mark.parametrize("micro_batches", [2, 8])
def test_no_streaming_run_passes_the_ceiling_for_its_trainer(kinds, eta, micro_batches):
    d = job_dict(**{"rollout.policy.eta": eta})
    if kinds == 1:
        d["cluster"]["groups"] = d["cluster"]["groups"][:2]
        d["rollout"]["workers"] = d["rollout"]["workers"][:1]
    job = load_rollout_spec(d)
    for v in rs.STREAMING[:-1]:  # the program's repack ties best-fit here and takes longest
        r = rs.StreamingTrainer(job, v, micro_batches).run()
        assert r.trajectories_per_s <= r.ceiling_tps * (1 + 1e-9), (v, r.trajectories_per_s, r.ceiling_tps)


def test_one_micro_batch_gives_the_whole_batch_trainers_ceiling(job):
    a = simulate(job, "repack-best-fit")
    assert rs.StreamingTrainer(job, "repack-best-fit", 1).run().ceiling_tps == pytest.approx(a.ceiling_tps, rel=1e-12)


@pytest.mark.parametrize("bad", ["nope:4", "h100x128", "h100x128:many"])
def test_a_bad_case_is_named_with_the_flag(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as e:
        rs.main(["--out", str(tmp_path), "--cases", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--cases" in err and repr(bad) in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing half-written
