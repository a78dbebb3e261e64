"""The calibration of the simulator to a real run: it recovers known costs from timing logs (decode per number of
processes computing at once, the driver's per-call overhead, the trainer slowed by the actors decoding beside
it), and the simulator charges them where the real run pays them (no Ray needed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from qsync_opt.rollout.calibrate import CalibratedCosts, CalibratedTrain, calibrate
from qsync_opt.rollout.simulate import simulate
from qsync_opt.rollout.spec import load_rollout_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rollout_cpu_tiny.yaml"
SHARE = [(1.0, 0.2, 0.001), (1.5, 0.25, 0.001), (2.0, 0.3, 0.002), (2.5, 0.35, 0.002), (3.0, 0.4, 0.003)]


@pytest.fixture(scope="module")
def job():
    return load_rollout_spec(EXAMPLE)


def _fake_results(rng, rounds=2):
    """Timing logs drawn from known costs, in the layout rollout.ray_run.run_rounds records."""
    out = {}
    for v in ("sync", "trajectory-async"):
        runs = []
        for _ in range(rounds):
            steps = []
            for _ in range(2000):
                k = int(rng.randint(1, 6))
                b = int(rng.randint(1, 17))
                tot = int(rng.randint(b * 8, b * 300))
                a0, a1, a2 = SHARE[k - 1]
                steps.append((b, tot, (a0 + a1 * b + a2 * tot) / 1e3, k, 0.0, 0.0, 0))
            pre = [(m, float(t), m * (1.5 + 0.02 * t) / 1e3, 0.0, 0.0)
                   for m, t in zip(rng.randint(1, 5, 50), rng.randint(8, 300, 50))]
            train = [(int(tok), 0.05 + 1e-4 * tok + 0.03 * g, 0.0, 0.0, 0.0, int(g))
                     for tok, g in zip(rng.randint(200, 2000, 40), rng.randint(0, 5, 40))]
            calls = [(0.004, 10, 0.0)] * 100
            logs = {"rollout": [{"step": steps, "prefill": pre, "load": []}], "calls": calls, "broadcast": [0.02],
                    "pull": [0.01], "train": train}
            runs.append(SimpleNamespace(logs=logs))
        out[v] = runs
    return out


def test_calibrate_recovers_the_costs_it_was_given(job):
    costs, sync, train_s, info = calibrate(job, _fake_results(np.random.RandomState(0)))
    c = costs[0]
    for k, want in enumerate(SHARE, start=1):  # one decode line per number of processes computing at once
        assert c.share[k - 1] == pytest.approx(want, rel=1e-6, abs=1e-9), k
    assert c.call_overhead_ms == pytest.approx(4.0)
    assert c.pre == pytest.approx((1.5, 0.02))
    assert (train_s.a, train_s.b, train_s.g) == pytest.approx((0.05, 1e-4, 0.03))
    assert train_s(1000, beside=4) == pytest.approx(0.05 + 0.1 + 0.12)
    assert sync.broadcast_s == pytest.approx(0.02) and c.pull_s == pytest.approx(0.01)


def test_call_overhead_is_per_call_not_per_step():
    c = CalibratedCosts("r", "cpu", 32, 4, 1e12, 1.0, 0.0, (1.0, 0.0, 0.0), (1.0, 0.0), (), 5.0, 16)
    assert [c.call_ms(n) for n in (1, 16, 17, 32, 33)] == [5.0, 5.0, 10.0, 10.0, 15.0]


def _calibrated(g, overhead_ms=0.0):
    share = tuple((1.0 + 0.5 * k, 0.2, 0.001) for k in range(5))
    costs = [CalibratedCosts("rollout", "cpu", 32, 4, 1e12, 1.0, 0.01, share[0], (1.5, 0.02), share, overhead_ms, 16)]
    from qsync_opt.rollout.costs import SyncCosts

    sync = SyncCosts(broadcast_s=0.02, push_s=0.0, relay_fanout_s=0.0, kv_link_gbs=1e-9, kv_link_latency_s=1e9)
    return costs, sync, CalibratedTrain(0.05, 1e-4, g)


def test_trainer_contention_charged_only_beside_decoding_actors(job):
    """sync trains while every actor waits, so the trainer's contention term cannot touch it; one-step-off trains
    while the actors decode, so it must pay it."""
    base, slow = _calibrated(0.0), _calibrated(0.05)
    s0, s1 = (simulate(job, "sync", costs=c, sync=s, train_s=t) for c, s, t in (base, slow))
    assert s1.sim_time_s == pytest.approx(s0.sim_time_s, rel=1e-12)
    o0, o1 = (simulate(job, "one-step-off", costs=c, sync=s, train_s=t) for c, s, t in (base, slow))
    assert 1 - o1.trainer_idle_frac > 1 - o0.trainer_idle_frac  # the trainer is busy longer per step


def test_call_overhead_slows_the_simulated_run(job):
    c0, s, t = _calibrated(0.0)
    c1, _, _ = _calibrated(0.0, overhead_ms=5.0)
    for v in ("sync", "trajectory-async"):
        assert simulate(job, v, costs=c1, sync=s, train_s=t).sim_time_s > \
            simulate(job, v, costs=c0, sync=s, train_s=t).sim_time_s


def test_broadcast_and_pull_calibrated_as_means(job):
    """The simulator sums broadcasts and pulls, so the calibration takes their mean (a sum's expectation), not the
    median: a run whose syncs are sometimes slow pays those slow syncs."""
    res = _fake_results(np.random.RandomState(0))
    for runs in res.values():
        for r in runs:
            r.logs["broadcast"], r.logs["pull"] = [0.01, 0.01, 0.04], [0.01, 0.01, 0.01, 0.05]
    costs, sync, _, _ = calibrate(job, res)
    assert sync.broadcast_s == pytest.approx(0.02) and costs[0].pull_s == pytest.approx(0.02)


class _Watched:
    """A Simulator that records, at each partial-rollout interrupt, when each worker's call in progress ends (from
    its chunk, independently of the simulator's rule) and when the drain ends and the broadcast completes."""

    @staticmethod
    def make(job, costs, sync, train_s):
        from qsync_opt.rollout.simulate import Simulator

        class W(Simulator):
            def _interrupt_broadcast(self):
                if not (self.interrupting or self.in_broadcast):
                    ends = []
                    for w in self.workers:
                        if w.chunk is not None:
                            t0, dt, n = w.chunk
                            done = min(n - 1, int((self.now - t0) / dt + 1e-9))
                            ends.append(t0 + min(n, (done // 16 + 1) * 16) * dt)
                        elif self.now < w.paused_until:
                            ends.append(w.paused_until)
                    self.seen.append({"at": self.now, "call_ends": max(ends, default=self.now)})
                super()._interrupt_broadcast()

            def _end_drain(self):
                self.seen[-1]["drained"] = self.now
                super()._end_drain()

            def _on_bcast_done(self, then):
                if then == "partial":
                    self.seen[-1]["bcast_done"] = self.now
                super()._on_bcast_done(then)

        s = W(job, "partial-rollout", costs, sync, None, None, train_s)
        s.seen = []
        return s


def test_partial_rollout_interrupt_waits_for_calls_then_extracts_and_broadcasts(job):
    """partial-rollout as the real driver runs it: at a new version every rollout finishes the call it is in (at
    most 16 decode steps, cut short by a finish), then one round trip takes the contexts out, then the broadcast;
    before, the simulator stopped every rollout at once and charged the broadcast alone."""
    costs, sync, train_s = _calibrated(0.0, overhead_ms=5.0)
    s = _Watched.make(job, costs, sync, train_s)
    r = s.run()
    assert s.seen and r.steps == job.rollout.steps
    full = [x for x in s.seen if "bcast_done" in x]
    assert full
    for x in full:
        assert x["drained"] == pytest.approx(x["call_ends"], abs=1e-9)  # nobody stops before its call returns
        assert x["drained"] >= x["at"]
        assert x["bcast_done"] - x["drained"] == pytest.approx(0.005 + sync.broadcast_s)  # extract, then broadcast
    assert any(x["drained"] > x["at"] + 1e-6 for x in full)  # some rollouts were mid-call
