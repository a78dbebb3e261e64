"""The gloo all-reduce fit and the spawned ranks that measure it (predictor/allreduce_profile.py)."""

from __future__ import annotations

import pytest

from qsync_opt.predictor import allreduce_profile


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
