"""The real run with Ray actors: trajectories are conserved, and a rollout actor killed mid-run
does not stop the run (its trajectories are re-queued; none lost, none trained twice)."""

from __future__ import annotations

import pytest

from qsync_opt.rollout.spec import load_rollout_spec

ray = pytest.importorskip("ray")


@pytest.fixture(scope="session")
def ray_session():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if started:
        ray.shutdown()


def _job(steps=3, policy="trajectory-async", rollouts=2):
    import yaml

    d = yaml.safe_load(open("examples/rollout_cpu_tiny.yaml"))
    d["cluster"]["groups"][1]["count"] = rollouts
    d["rollout"].update(steps=steps, policy={"kind": policy}, repack={"method": "none"})
    return load_rollout_spec(d)


def _check_conserved(job, res):
    ids = res.trained_ids
    assert res.steps == job.rollout.steps
    assert len(ids) == job.rollout.steps * job.rollout.workload.batch
    assert len(set(ids)) == len(ids)  # none trained twice


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["trajectory-async"])
def test_killed_actor_does_not_stop_the_run(ray_session, variant):
    from qsync_opt.rollout.ray_run import Driver, make_actors

    job = _job(policy=variant)
    actors, trainer = make_actors(job)
    d = Driver(job, variant, actors, trainer, kill_after_steps=1)
    res = d.run()
    assert len(res.lost_actors) == 1
    _check_conserved(job, res)
    # every trajectory admitted is trained, waiting, or in flight on a live actor: none lost
    in_flight = {t for i in d.alive for t in d.w[i]["inflight"]}
    buffered = {t for t, _ in d.buffer} | {t for t, _ in d.step_got}
    assert set(res.trained_ids) | in_flight | buffered | set(d.queue) == set(range(d.next_id))
    for a in actors:
        ray.kill(a)
    ray.kill(trainer)


def test_run_without_ray_is_a_spec_error(monkeypatch):
    import builtins

    from qsync_opt.errors import SpecError
    from qsync_opt.rollout import ray_run

    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray":
            raise ImportError("no ray")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(SpecError, match=r"needs Ray: pip install"):
        ray_run.start_ray()


@pytest.mark.slow
def test_streaming_trainer_runs_micro_batches_and_trains_each_trajectory_once(ray_session):
    from qsync_opt.rollout.ray_run import Driver, make_actors

    d = _job(steps=3).model_dump()
    d["rollout"]["trainer_micro_batches"] = 4
    job = load_rollout_spec(d)
    actors, trainer = make_actors(job)
    res = Driver(job, "trajectory-async", actors, trainer).run()
    _check_conserved(job, res)
    log = ray.get(trainer.logs.remote())
    assert [t[5] for t in log] == [False, False, False, True] * job.rollout.steps  # 3 micro-batches, then the step
    assert all(t[4] > 0 for t in log if t[5]) and all(t[4] == 0 for t in log if not t[5])
    for a in actors:
        ray.kill(a)
    ray.kill(trainer)
