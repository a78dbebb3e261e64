"""Processes sharing the indicator and profile caches: one computes an entry, the others wait
for it and read it; none reads half of one (io.entry_lock + atomic writes). Ordered by events,
never by sleeps: each step waits for the other process to reach a named point."""

from __future__ import annotations

import multiprocessing as mp
import os

from qsync_opt.training.spec import load_spec

SPEC = """
cluster:
  groups: [{name: cpu, device: cpu-local}]
model: {name: tiny-cnn}
training: {global_batch: 8, optimizer: sgd}
indicator: {method: gvar, calibration: {batches: 1, batch_size: 4}}
"""
HANG_S = 120  # a hang detector only: every wait below ends as soon as its event is set

ctx = mp.get_context("spawn")  # not fork: the test process may already run threads (torch, HiGHS), which a fork would inherit locked


def _count_gvar(counter, computing=None, release=None):
    """Wrap the gvar indicator: count its runs, and optionally hold the first until released."""
    import qsync_opt.training.predictor.gvar as gvar

    real = gvar.gvar_indicator

    def counted(*args, **kwargs):
        with counter.get_lock():
            counter.value += 1
        if computing is not None:
            computing.set()
            assert release.wait(HANG_S), "never released"
        return real(*args, **kwargs)

    gvar.gvar_indicator = counted


def _first(cache, counter, computing, release, out):
    os.environ["QSYNC_OPT_PROFILE_DIR"] = cache
    _count_gvar(counter, computing, release)
    from qsync_opt.training.predictor.indicators import compute_indicator

    sens, note = compute_indicator(load_spec(SPEC))
    out.put(("first", sens.omega, note))


def _second(cache, counter, waiting, out):
    os.environ["QSYNC_OPT_PROFILE_DIR"] = cache
    _count_gvar(counter)
    from qsync_opt.training.predictor.indicators import compute_indicator

    sens, note = compute_indicator(load_spec(SPEC), log=lambda s: s.startswith("waiting") and waiting.set())
    out.put(("second", sens.omega, note))


def test_two_processes_compute_one_indicator_entry_once(tmp_path):
    counter, out = ctx.Value("i", 0), ctx.Queue()
    computing, release, waiting = ctx.Event(), ctx.Event(), ctx.Event()
    a = ctx.Process(target=_first, args=(str(tmp_path), counter, computing, release, out))
    a.start()
    try:
        assert computing.wait(HANG_S)  # the first is inside the computation, the entry not written yet
        b = ctx.Process(target=_second, args=(str(tmp_path), counter, waiting, out))
        b.start()
        # the second either waits for the first's lock (right) or starts computing too (the bug)
        while not waiting.is_set() and counter.value < 2 and b.is_alive():
            waiting.wait(0.05)
    finally:
        release.set()
    got = dict((who, (omega, note)) for who, omega, note in (out.get(timeout=HANG_S) for _ in range(2)))
    a.join(HANG_S), b.join(HANG_S)
    assert counter.value == 1, "the same entry was computed twice at once"
    assert got["second"][0] == got["first"][0]
    assert "computed by another process meanwhile" in got["second"][1]
    assert [p.name for p in (tmp_path / "indicators").iterdir() if p.suffix == ".json"] and \
        not list((tmp_path / "indicators").glob(".*.tmp"))  # no temporary left behind


def _profile_waiting(path, waiting):
    from qsync_opt.training.predictor.profiler import profile_spec

    profile_spec(load_spec(SPEC), path, log=lambda s: s.startswith("waiting") and waiting.set())


def test_a_second_profiling_run_waits_for_the_first(tmp_path):
    """Two profilers at once would time each other's load; the second waits (and says so)."""
    from qsync_opt.io import entry_lock

    path = tmp_path / "profile.json"
    waiting = ctx.Event()
    with entry_lock(path):  # as a profile_spec run in progress holds it
        p = ctx.Process(target=_profile_waiting, args=(str(path), waiting))
        p.start()
        try:
            assert waiting.wait(HANG_S), "profile_spec did not wait for the lock"
            assert not path.exists()  # and measured nothing meanwhile
        finally:
            p.terminate()
            p.join(HANG_S)


def test_entry_lock_excludes_threads_of_one_process_too(tmp_path):
    import threading

    from qsync_opt.io import entry_lock

    waited = threading.Event()
    order = []

    def other():
        with entry_lock(tmp_path / "e", on_wait=waited.set):
            order.append("other")

    with entry_lock(tmp_path / "e"):
        t = threading.Thread(target=other)
        t.start()
        assert waited.wait(HANG_S)
        order.append("holder")
    t.join(HANG_S)
    assert order == ["holder", "other"]
