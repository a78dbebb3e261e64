"""The data plane's prefetch: step t+1 is planned on a background thread while step t runs, with
the same samples and split as without it, a checkpoint that describes the steps handed out, and
each plan's critical-path wait reported. Synchronised by events, never by timing."""

import threading

from qsync_opt.loading import plane as P
from qsync_opt.loading.cost import CostModel
from tests.loading.plane_cases import make_plane


def steps(plane, n):
    return [plane.next_batch() for _ in range(n)]


def test_prefetch_gives_the_same_samples_and_split():
    inline, ahead = make_plane(backend=None), make_plane(backend=None, prefetch=True)
    try:
        for a, b in zip(steps(inline, 14), steps(ahead, 14)):
            assert (a.step, a.samples, a.owner, a.predicted) == (b.step, b.samples, b.owner, b.predicted)
            assert b.wait_s >= 0 and b.plan_s >= 0
    finally:
        ahead.close()


def test_checkpoint_with_a_plan_prefetched_resumes_the_same_sequence():
    inline, ahead = make_plane(backend=None), make_plane(backend=None, prefetch=True)
    try:
        steps(inline, 11)
        steps(ahead, 11)  # step 11 is already drawn and being planned
        state = ahead.state_dict()
        assert state == inline.state_dict()
        resumed = make_plane(backend=None)
        resumed.load_state_dict(state)
        want = inline.next_batch()
        for got in (resumed.next_batch(), ahead.next_batch()):
            assert (got.step, got.samples, got.owner) == (want.step, want.samples, want.owner)
        ahead.load_state_dict(state)  # drops the prefetched step 12 and rewinds
        assert ahead.next_batch().samples == want.samples
    finally:
        ahead.close()


def test_next_step_is_planned_while_the_current_one_runs(monkeypatch):
    """After step 0 is handed out, step 1's planning starts on another thread before step 1 is
    asked for; the caller's next_batch then only collects it."""
    real = P.B.balance
    started, release = threading.Event(), threading.Event()
    threads = []

    def gated(inst, **kw):
        threads.append(threading.current_thread().name)
        if len(threads) == 2:  # step 1's planning
            started.set()
            assert release.wait(30)
        return real(inst, **kw)

    monkeypatch.setattr(P.B, "balance", gated)
    plane = make_plane(backend=None, prefetch=True)
    try:
        first = plane.next_batch()
        assert started.wait(30)  # planning step 1 while "step 0 runs"
        assert threads[0] == threading.current_thread().name and threads[1].startswith("plane-prefetch")
        release.set()
        second = plane.next_batch()
        assert (first.step, second.step) == (0, 1)
    finally:
        release.set()
        plane.close()


def test_a_refit_between_steps_is_reported_and_predicted_with_the_new_model():
    plane = make_plane(backend=None, prefetch=True)
    try:
        plane.next_batch()
        plane.cost = CostModel(a=2.0, b=0.02)  # refitted while step 1 was being planned
        plan = plane.next_batch()
        assert plan.detail["planned_with_previous_model"]
        want = [0.0, 0.0]
        for L, r in zip(plan.lengths, plan.owner):
            want[r] += plane.cost(L) / plane.speeds[r]
        assert plan.predicted == want
        assert not plane.next_batch().detail.get("planned_with_previous_model")
    finally:
        plane.close()


def test_close_drops_the_prefetched_plan_and_plans_inline_after():
    inline, ahead = make_plane(backend=None), make_plane(backend=None, prefetch=True)
    steps(inline, 3)
    steps(ahead, 3)
    ahead.close()
    ahead.prefetch = False
    assert ahead.state_dict() == inline.state_dict()
    assert ahead.next_batch().samples == inline.next_batch().samples
