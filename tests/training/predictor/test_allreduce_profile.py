"""The gloo all-reduce fit and the spawned ranks that measure it (predictor/allreduce_profile.py)."""

from __future__ import annotations

import pytest

from qsync_opt.training.predictor import allreduce_profile
class _Exited(Exception):
    def __init__(self, code: int):
        self.code = code


def test_a_spawned_rank_leaves_without_destructors_once_its_results_are_written(tmp_path, monkeypatch):
    """A gloo thread's destructor aborted finished ranks at interpreter exit (SIGABRT, the
    launcher then reported the measurement failed); the rank must leave by os._exit after writing."""
    import qsync_opt.runtime.process_exit as process_exit

    def fake_collectives(spec, rank, world, init_method, out_dir, *, ar, ddp):
        (out_dir / "allreduce.json").write_text('{"4096": 0.1, "65536": 0.2}')

    def exit_(code):
        raise _Exited(code)

    monkeypatch.setattr(allreduce_profile, "collectives", fake_collectives)
    monkeypatch.setattr(process_exit, "exit_without_destructors", exit_)
    with pytest.raises(_Exited) as e:
        allreduce_profile._worker(0, 1, 0, None, str(tmp_path), True, False)
    assert e.value.code == 0
    assert (tmp_path / "allreduce.json").exists()


def test_two_spawned_ranks_fit_this_machines_all_reduce():
    fit = allreduce_profile.measure_allreduce(2)
    assert set(fit) == {"alpha_ms", "beta_ms_per_byte"}
    assert fit["alpha_ms"] >= 0 and fit["beta_ms_per_byte"] > 0  # 16 MiB never costs what 4 KiB does


def test_the_ddp_step_is_read_as_train_reads_it_the_slowest_rank_per_step_then_the_median(tmp_path):
    """Not the slowest rank's median: with rank 0 slow in step 0 and rank 1 in step 1, every
    iteration waited for one of them, and train's figure (25) is not either rank's median (12, 13)."""
    import json

    (tmp_path / "ddp.0").write_text(json.dumps([10.0, 30.0, 12.0]))
    (tmp_path / "ddp.1").write_text(json.dumps([25.0, 11.0, 13.0]))
    fit, ddp = allreduce_profile.read_results(tmp_path, 2)
    assert fit is None and ddp == 25.0


def test_a_missing_rank_leaves_no_ddp_step(tmp_path):
    (tmp_path / "ddp.0").write_text("[10.0]")
    assert allreduce_profile.read_results(tmp_path, 2) == (None, None)


def test_step_times_take_the_warm_ups_untimed_and_the_rest_one_by_one():
    from qsync_opt.training.predictor.step_profile import lockstep_median_ms, step_times_ms

    calls = []
    times = step_times_ms(lambda: calls.append(1), warmup=3, calls=7)
    assert len(calls) == 10 and len(times) == 7 and all(t >= 0 for t in times)
    with pytest.raises(ValueError):  # ranks that took different numbers of steps are not a lockstep
        lockstep_median_ms([[1.0, 2.0], [1.0]])
