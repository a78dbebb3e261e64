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


@pytest.mark.parametrize("variant", ["sync", "trajectory-async"])
def test_round_trip_of_a_call_is_not_generating(job, variant):
    """The real run counts an actor generating from a call's start to its return (rollout.driver), so the driver's
    round trip is idle there; the simulator must count it the same. One step per call, a flat a-ms step with an
    o-ms trip against a flat (a + o)-ms step with none: the same schedule, and a generating share a / (a + o) of
    the second's (prefill priced at the 1 µs floor)."""
    from qsync_opt.rollout.costs import SyncCosts

    a, o = 3.0, 1.0

    def costs(step_ms, trip_ms):
        line = ((step_ms, 0.0, 0.0),) * 5
        return [CalibratedCosts("rollout", "cpu", 32, 4, 1e12, 1.0, 0.01, line[0], (0.0, 0.0), line, trip_ms, 1)]

    sync = SyncCosts(broadcast_s=0.02, push_s=0.0, relay_fanout_s=0.0, kv_link_gbs=1e-9, kv_link_latency_s=1e9)
    train = CalibratedTrain(0.05, 1e-4, 0.0)
    with_trip = simulate(job, variant, costs=costs(a, o), sync=sync, train_s=train)
    folded = simulate(job, variant, costs=costs(a + o, 0.0), sync=sync, train_s=train)
    assert with_trip.sim_time_s == pytest.approx(folded.sim_time_s, rel=1e-9)
    assert 1 - with_trip.rollout_idle_frac == pytest.approx((1 - folded.rollout_idle_frac) * a / (a + o), rel=1e-3)


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


def test_trainer_contention_fitted_against_the_mean_number_decoding_during_its_step(job):
    """The actors decoding beside a trainer step change within it (a barrier policy's rollouts finish mid-step): the
    fit takes the time-averaged count of step calls in flight over the step, not the count at its issue."""
    from qsync_opt.rollout.calibrate import _beside_mean

    # a step issued at 1.0 s, 0.2 s long; calls: one over all of it, one over half, one before it, one after
    calls = [(0.0, 1, 0.5, 1.5), (0.0, 1, 1.1, 1.2), (0.0, 1, 0.2, 0.9), (0.0, 1, 1.3, 2.0)]
    t = (1000, 0.2, 0.0, 0.0, 1.0, 3, 0.2)
    assert _beside_mean(t, calls) == pytest.approx(1.5)
    # recovered from logs whose wall follows the mean, with the count at issue saying otherwise
    rng = np.random.RandomState(1)
    res = _fake_results(rng)
    for runs in res.values():
        for r in runs:
            train, calls = [], []
            for i, tok in enumerate(rng.randint(200, 2000, 40)):
                start, mean = 10.0 * i, rng.uniform(0, 4)
                dt = 0.05 + 1e-4 * tok + 0.03 * mean
                calls += [(0.004, 10, start - 1, start + dt)] * int(mean) + \
                         [(0.004, 10, start - 1, start + dt * (mean - int(mean)))]
                train.append((int(tok), dt, 0.0, 0.0, start, 4, dt))
            r.logs["train"], r.logs["calls"] = train, calls
    _, _, train_s, _ = calibrate(job, res)
    assert (train_s.a, train_s.b, train_s.g) == pytest.approx((0.05, 1e-4, 0.03))


class _Traced:
    """A Simulator on calibrated costs that records every decode chunk (start, n steps, s per step, processes
    computing at its start) and, for each trainer step, its start, end, padded tokens and the count decoding
    beside it at every change."""

    @staticmethod
    def run(job, variant, costs, sync, train_s):
        from qsync_opt.rollout.simulate import Simulator

        class T(Simulator):
            def _start_chunk(self, w):
                before = w.chunk
                super()._start_chunk(w)
                if w.chunk is not None and w.chunk is not before:
                    self.chunks.append((w.chunk, self.n_gen + self.trainer_busy, len(w.batch), w.total_ctx()))

            def _set_state(self, w, state):
                super()._set_state(w, state)
                if self.trainer_busy:
                    self.train[-1]["beside"].append((self.now, self._beside()))

            def _maybe_train(self):
                busy = self.trainer_busy
                super()._maybe_train()
                if self.trainer_busy and not busy:
                    self.train.append({"start": self.now, "tokens": self.train_ps.tokens,
                                       "beside": [(self.now, self._beside())]})

            def _on_train_done(self):
                self.train[-1]["end"] = self.now
                super()._on_train_done()

        s = T(job, variant, costs, sync, None, None, train_s)
        s.chunks, s.train = [], []
        r = s.run()
        return s, r


def test_decode_charged_per_call_at_the_contention_read_at_each_call(job):
    """On a shared host the simulator runs one chunk per driver call (16 decode steps at most, as the real driver
    issues them), each charged at the number computing when it starts: a rollout left alone in a barrier policy's
    tail pays the alone price within 16 steps, not, for hundreds of steps, the contention its chunk began in."""
    costs, sync, train_s = _calibrated(0.03, overhead_ms=5.0)
    c = costs[0]
    s, r = _Traced.run(job, "sync", costs, sync, train_s)
    assert r.steps == job.rollout.steps and s.chunks
    assert max(n for (_, _, n), *_ in s.chunks) == 16
    for (_, dt, n), busy, b, ctx in s.chunks:
        assert 1 <= n <= 16
        assert dt == pytest.approx((c.decode_ms_shared(b, ctx + b * (n - 1) / 2, busy) + c.call_overhead_ms / n) / 1e3)
    assert any(busy == 1 for _, busy, *_ in s.chunks)  # the tails ran alone


@pytest.mark.parametrize("variant", ["one-step-off", "trajectory-async"])
def test_trainer_step_retimed_at_each_change_of_the_actors_beside_it(job, variant):
    """Processor sharing: a trainer step progresses at 1 / train_s(tokens, beside) of itself per second, with
    `beside` the rollouts decoding at that moment; its end is where the progress reaches 1, integrated here from
    the recorded changes independently of the simulator's bookkeeping. Its tokens are the padded batch's."""
    costs, sync, train_s = _calibrated(0.03)
    s, r = _Traced.run(job, variant, costs, sync, train_s)
    assert r.steps == job.rollout.steps and len(s.train) == job.rollout.steps
    changed = 0
    for st in s.train:
        pts = [(t, k) for t, k in st["beside"] if t <= st["end"]]
        done = 0.0
        for (t0, k), (t1, _) in zip(pts, pts[1:] + [(st["end"], None)]):
            done += (t1 - t0) / train_s(st["tokens"], beside=k)
        assert done == pytest.approx(1.0, abs=1e-9)
        changed += len({k for _, k in pts}) > 1
    assert changed  # some steps saw the count change


def test_trainer_tokens_are_the_padded_batch(job):
    """The real trainer pads its batch to the longest trajectory: the calibrated simulator charges trajectories ×
    the longest, the modelled GPU trainer (sequence packing) the sum."""
    from qsync_opt.rollout.simulate import Simulator

    costs, sync, train_s = _calibrated(0.0)
    seen = {}

    class T(Simulator):
        def _maybe_train(self):
            busy = self.trainer_busy
            super()._maybe_train()
            if self.trainer_busy and not busy and not seen:
                batch = list(self.step_got)  # one micro-batch: the whole step
                seen["want"] = len(batch) * max(t.prompt + t.target for t in batch)
                seen["sum"] = sum(t.prompt + t.target for t in batch)
                seen["got"] = self.train_ps.tokens

    T(job, "trajectory-async", costs, sync, None, None, train_s).run()
    assert seen["got"] == seen["want"] > seen["sum"]


def test_prefill_fit_separates_the_admission_constant_from_the_per_sequence_line(job):
    """An admission costs a constant besides its sequences (measured ~6 ms against ~0.6 ms a sequence here): fitted
    per sequence alone, the constant spread over the sequences charged large admissions far over their wall."""
    res = _fake_results(np.random.RandomState(2))
    rng = np.random.RandomState(3)
    for runs in res.values():
        for r in runs:
            ms, toks = rng.randint(1, 15, 80), rng.randint(8, 300, 80)
            r.logs["rollout"][0]["prefill"] = [(int(m), float(t), (4.0 + m * (0.5 + 0.02 * t)) / 1e3, 0.0, 0.0)
                                               for m, t in zip(ms, toks)]
    costs, _, _, info = calibrate(job, res)
    c = costs[0]
    assert c.pre_call_ms == pytest.approx(4.0) and c.pre == pytest.approx((0.5, 0.02))
    assert c.prefill_ms(14, 100) == pytest.approx(4.0 + 14 * 2.5)
    assert c.prefill_set_ms([100, 200, 0]) == pytest.approx(4.0 + 2.5 + 4.5)
    assert info["prefill_ms_per_admission"] == pytest.approx(4.0)


def test_train_fit_takes_the_optimizer_step_and_publishing_apart(job):
    # a streaming trainer's calls: three micro-batches, then the step's last with the optimizer step and publishing
    # (timed apart by the trainer); the fit recovers the per-call line and charges the publishing once a step
    rng = np.random.RandomState(2)
    res = _fake_results(rng)
    for runs in res.values():
        for r in runs:
            train = []
            for i, tok in enumerate(rng.randint(200, 2000, 40)):
                last = i % 4 == 3
                pub = 0.02 + rng.uniform(-0.002, 0.002) if last else 0.0
                dt = 0.05 + 1e-4 * tok + pub
                train.append((int(tok), dt, 0.0, 0.0, 10.0 * i, 0, dt, pub, last))
            r.logs["train"], r.logs["calls"] = train, []
    _, _, train_s, info = calibrate(job, res)
    assert (train_s.a, train_s.b) == pytest.approx((0.05, 1e-4), rel=1e-6)
    assert train_s.publish == pytest.approx(0.02, abs=1e-3) and info["train_publish_s"] == train_s.publish
    from qsync_opt.rollout.costs import micro_batch_seconds

    assert micro_batch_seconds(train_s, 1000, 4, last=False) == pytest.approx(0.05 + 0.1)
    assert micro_batch_seconds(train_s, 1000, 4, last=True) == pytest.approx(0.05 + 0.1 + train_s.publish)
