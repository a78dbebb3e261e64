"""Deterministic discrete-event simulation of the RL loop: rollouts, trainer, weight sync, repack.

Each rollout worker decodes its batch with continuous batching: one decode step of B sequences
whose contexts sum to ΣL costs t(B, ΣL) (the serving cost model, rollout.costs), admission
prefills the new prompts, and a trajectory stops at its drawn length. Between two changes of a
worker's batch (a trajectory ends, one is admitted or moved, a sync) every step has the same B and
ΣL grows by B per step, so the worker advances a whole chunk at once at the step time of the
chunk's mean context (exact when t is affine in ΣL, as in the memory-bound regime); events are
trajectory ends, admissions, syncs, trainer steps and repack ticks, so a run of 64 workers and
1,000 trainer steps takes seconds. Admission reserves each trajectory's drawn final length in KV
(a perfect length predictor: no preemption) under the decode-batch cap. Everything is seeded.

Policies (Policy.kind):

* sync: round r (one trainer batch) is generated with version r; the trainer trains it while the
  rollouts wait; then a global broadcast (trainer and every rollout stall).
* one-step-off: round r is generated with version r − 1 while the trainer trains round r − 1;
  each round boundary waits for the round's last trajectory, then broadcasts.
* stale (η): streaming; admissions bounded by AReaL's rule, admitted ≤ (η + version + 1)·batch;
  a new version makes the rollouts stop admitting and drain every in-flight trajectory, then a
  global broadcast (the trainer takes part when its step ends).
* partial-rollout (η): streaming; a new version interrupts every rollout: each finishes the call it is in
  (the costs' steps_per_call decode steps at most; the step in flight for the modelled engines), the contexts
  are extracted (one round trip), the weights broadcast, and the in-flight trajectories resume by re-prefilling
  their contexts with the new weights.
* trajectory-async (η, Laminar): streaming; the trainer pushes each version to the master relay
  (its only stall) and relays fan it out; a rollout admits only while its weights are less than η
  versions behind the relay; then it drains its own batch and pulls from its node's relay (only it
  stalls). With repack, every `interval_s` the draining rollouts of each version are repacked
  (rollout.repack): freed ones pull at once, receivers pause for the migration (re-prefill or KV
  transfer, the cheaper, plus `decision_s`).

Staleness of a trajectory = the trainer's version when it trains on it − the version its first
token was generated with.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from qsync_opt.rollout.costs import (
    SyncCosts,
    all_worker_costs,
    sync_costs,
    trainer_step_s,
)
from qsync_opt.rollout.sim_metrics import Metrics, SimResult
from qsync_opt.rollout.sim_policies import PolicyRules
from qsync_opt.rollout.sim_records import (
    ADMIT,
    FINISH,
    FIRST,
    GEN,
    IDLE,
    MIGRATE,
    STATES,
    SYNC,
    VARIANTS,
    Chunk,
    Finish,
    SimTraj,
    SimWorker,
    variant_of,
)
from qsync_opt.rollout.sim_repack import RepackTick
from qsync_opt.rollout.sim_workload import draw
from qsync_opt.rollout.spec import STREAMING

__all__ = ["GEN", "IDLE", "MIGRATE", "STATES", "SYNC", "VARIANTS", "SimResult", "Simulator", "simulate", "variant_of"]


class Simulator(PolicyRules, RepackTick, Metrics):
    """The event loop: workload, events, workers' decode chunks, admission and the run; the policy
    rules are rollout.sim_policies, the repack tick rollout.sim_repack, KV sampling and the result
    rollout.sim_metrics, the records rollout.sim_records."""

    def __init__(self, job, variant: str | None = None, costs: list | None = None, sync: SyncCosts | None = None,
                 steps: int | None = None, timeline_until: float | None = None, train_s=None, seed: int | None = None,
                 backend: str | None = None):
        r = job.rollout
        self.job = job
        self.variant = variant or variant_of(job)
        self.kind = {"repack-best-fit": "trajectory-async", "repack-program": "trajectory-async"}.get(self.variant,
                                                                                                    self.variant)
        self.repack_method = {"repack-best-fit": "best-fit", "repack-program": "program"}.get(self.variant, "none")
        if variant is None and self.kind == "trajectory-async":
            self.repack_method = r.repack.method
        self.eta = r.policy.eta or 1
        self.B = r.workload.batch
        self.steps_target = steps or r.steps
        self.cap = r.repack.batch_cap
        self.theta = r.repack.kv_threshold
        self.backend = backend or r.solver.backend
        self.time_limit = r.solver.time_limit_s
        self.sync = sync or sync_costs(job)
        self.train_s = train_s or (lambda tokens: trainer_step_s(job, tokens))
        self.train_given = train_s  # None: the job's own trainer price (rollout.costs.trainer_step_s)
        self.per_step_s = r.trainer_step_s if train_s is None else None  # a step given in seconds, not per token
        # micro-batches the trainer computes a step over (rollout.trainer_micro_batches; the barrier policies train a
        # round at once): PolicyRules._maybe_train; the run's ceiling is the one for that trainer (bounds_staleness)
        self.micro_batches = r.trainer_micro_batches if self.kind in STREAMING else 1
        kinds = costs or all_worker_costs(job)
        self.shared_host = all(hasattr(c, "decode_ms_shared") for c in kinds)
        self.n_gen = 0
        self.workers: list[SimWorker] = []
        own_cap = {w.group: w.batch_cap for w in r.workers if w.batch_cap is not None}
        for wc in kinds:
            for i in range(wc.count):
                self.workers.append(SimWorker(len(self.workers), wc, f"{wc.group}[{i}]"))
                self.workers[-1].cap = min(self.cap, own_cap.get(wc.group, self.cap))
        self.timeline_until = timeline_until
        self._draw(seed if seed is not None else r.seed)
        # state
        self.now = 0.0
        self.events: list = []
        self.seq = 0
        self.next_id = 0
        self.queue: list[SimTraj] = []  # interrupted / re-queued trajectories go first
        self.buffer: list[SimTraj] = []  # finished, waiting for the trainer
        self.step_got: list[SimTraj] = []  # the step's trajectories taken so far (streaming: as they finish)
        self.step_done = 0  # its micro-batches computed
        self.train_last = True  # what the trainer computes ends its step
        self.version = 0  # trainer's latest version
        self.rollout_version = 0  # global (broadcast policies)
        self.relay_version = 0
        self.trainer_busy = False
        self.trainer_stall_until = 0.0
        self.trainer_time = 0.0
        self.train_epoch, self.train_ps = 0, None
        self.trained = 0
        self.tokens_trained = 0
        self.stale = []
        self.consumed: list[tuple[int, int]] = []  # (prompt, length) of each trained trajectory (rollout.bounds)
        self.sync_pending = False
        self.in_broadcast = False
        self.interrupting = self.interrupt_again = False  # partial-rollout: draining the rollouts' calls
        self.undrained: set[int] = set()
        self.round = 0  # barrier policies: the round being generated
        self.round_done = {}  # round -> finished count
        self.repacks = self.moves = 0
        self.repack_overhead = 0.0
        self.reprefill_s = 0.0  # partial-rollout: rollout-seconds re-prefilling interrupted trajectories
        self.trip_total = 0.0  # shared host: rollout-seconds of decode calls spent in the driver's round trip
        self.solver_walls: list[float] = []
        self.repack_clock_stops = 0
        self.tail_extension_s = 0.0
        self.kv_series: list = []
        self.batch_series: list = []  # (time, mean decode batch of busy workers, mean decode stretch), per KV sample
        self.kinds = list({id(w.c): w.c for w in self.workers}.values())
        self.t_end = 0.0

    # ---------------------------------------------------------------- workload
    def _draw(self, seed):
        self.prompts, self.targets = draw(self.job, self.steps_target, self.eta, seed)
        self.n_max = len(self.targets)
        self.times = np.full((self.n_max, 5), np.nan)  # per trajectory id: sim_records.ADMIT … STEP_END

    def _new_traj(self) -> SimTraj:
        i = self.next_id
        self.next_id += 1
        self.times[i, ADMIT] = self.now
        return SimTraj(i, int(self.prompts[i]), int(self.targets[i]), i // self.B)

    # ---------------------------------------------------------------- events
    def _push(self, t, kind, *payload):
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def _set_state(self, w: SimWorker, state: str):
        if state == w.state:
            return
        self.n_gen += (state == GEN) - (w.state == GEN)
        now = self.now
        w.totals[w.state] += now - w.since
        if self.timeline_until is not None and w.since < self.timeline_until and now > w.since:
            w.segments.append((w.since, min(now, self.timeline_until), w.state))
        w.state, w.since = state, now
        if self.train_ps is not None:
            self._retime_train()

    def _progress(self, w: SimWorker):
        """Advance w's steps to now and cancel its chunk event."""
        if w.chunk is not None:
            t0, dt, n = w.chunk
            self._advance(w, min(n, int((self.now - t0) / dt + 1e-9)) if dt > 0 else n)
            w.chunk = None
        w.epoch += 1

    def _advance(self, w: SimWorker, steps: int):
        """w decoded `steps` steps of its chunk: each paid its share of the call's round trip (not generating)."""
        w.steps += steps
        self.trip_total += steps * w.trip_s

    def _start_chunk(self, w: SimWorker):
        if w.chunk is not None or self.now < w.paused_until:
            return
        while w.heap and (w.heap[0].tid not in w.batch or w.batch[w.heap[0].tid].stint != w.heap[0].stint):
            heapq.heappop(w.heap)
        if not w.batch:
            self._set_state(w, IDLE)
            return
        b = len(w.batch)
        n = max(1, w.heap[0].step - w.steps)
        self._set_state(w, GEN)
        if self.shared_host:  # costs measured on one machine whose cores the workers and the trainer share
            # one chunk per call, as the real driver issues them (MAX_STEPS_PER_CALL, cut short by a finish): the
            # number computing at once is read at each call, so a rollout left alone in a tail is not charged, for
            # hundreds of steps, the contention of the moment its chunk began
            n = min(n, max(1, int(getattr(w.c, "steps_per_call", n))))
            busy = self.n_gen + self.trainer_busy
            w.trip_s = w.c.call_ms(n) / n / 1e3
            dt = w.c.decode_ms_shared(b, w.total_ctx() + b * (n - 1) / 2, busy) / 1e3 + w.trip_s
        else:
            dt = w.c.decode_ms(b, w.total_ctx() + b * (n - 1) / 2) / 1e3
        w.chunk = Chunk(self.now, dt, n)
        w.epoch += 1
        self._set_state(w, GEN)
        self._push(self.now + n * dt, "chunk", w.idx, w.epoch)

    @staticmethod
    def _prefill_s(w: SimWorker, ctxs: list) -> float:
        """Seconds to prefill these contexts on w in one micro-batch: equal lengths at the memoised uniform price,
        unequal ones (re-queued or interrupted trajectories) with attention at Σ L² (WorkerCosts.prefill_set_ms)."""
        if min(ctxs) == max(ctxs):
            return w.c.prefill_ms(len(ctxs), ctxs[0]) / 1e3
        return w.c.prefill_set_ms(ctxs) / 1e3

    def _pause(self, w: SimWorker, seconds: float, state: str):
        self._progress(w)
        w.paused_until = self.now + seconds
        self._set_state(w, state)
        self._push(w.paused_until, "resume", w.idx, w.epoch)

    def _add(self, w: SimWorker, t: SimTraj):
        t.worker, t.start_step = w.idx, w.steps
        t.stint += 1
        if t.stint == 1:
            self.times[t.id, FIRST] = self.now
        w.batch[t.id] = t
        w.c0 += t.prompt + t.gen_base - w.steps
        w.reserved += t.prompt + t.target
        heapq.heappush(w.heap, Finish(w.steps + t.target - t.gen_base, t.stint, t.id))

    def _remove(self, w: SimWorker, t: SimTraj):
        t.gen_base += w.steps - t.start_step
        del w.batch[t.id]
        w.c0 -= t.prompt + (t.gen_base - (w.steps - t.start_step)) - t.start_step
        w.reserved -= t.prompt + t.target
        t.worker = None

    def _fits(self, w: SimWorker, t: SimTraj) -> bool:
        return len(w.batch) < w.cap and w.reserved + t.prompt + t.target <= w.c.kv_capacity_tokens

    def _peek(self) -> SimTraj | None:
        if self.queue:
            return self.queue[0]
        if self.next_id < self._gate():
            t = self._new_traj()
            self.queue.append(t)
            return t
        return None

    def _dispatch(self, candidates=None):
        """Admit queued / new trajectories, one at a time to the least-loaded eligible worker."""
        if not self.queue and self.next_id >= self._gate():
            return
        ws = [w for w in (candidates if candidates is not None else self.workers) if self._may_admit(w)]
        if not ws:
            return
        if len(ws) == 1:  # one worker at its chunk boundary: fill its free slots in order
            w, ts = ws[0], []
            while True:
                t = self._peek()
                if t is None or not self._fits(w, t):
                    break
                self.queue.pop(0)
                if not ts:
                    self._progress(w)
                if t.version is None:
                    t.version = w.version if self.kind == "trajectory-async" else self.rollout_version
                self._add(w, t)
                ts.append(t)
            if ts:
                self._pause(w, self._prefill_s(w, [t.prompt + t.gen_base for t in ts]), GEN)
            return
        heap = [(len(w.batch), w.idx) for w in ws]
        heapq.heapify(heap)
        got: dict[int, list[SimTraj]] = {}
        blocked = []
        while heap:
            t = self._peek()
            if t is None:
                break
            b, i = heapq.heappop(heap)
            w = self.workers[i]
            if not self._fits(w, t):
                blocked.append((b, i))
                continue
            self.queue.pop(0)
            if not got.get(i):
                self._progress(w)
            got.setdefault(i, []).append(t)
            if t.version is None:
                t.version = w.version if self.kind == "trajectory-async" else self.rollout_version
            self._add(w, t)
            heapq.heappush(heap, (b + 1, i))
            # a worker that could not take this one may take a smaller one later: keep order simple
        for i, ts in got.items():
            w = self.workers[i]
            self._pause(w, self._prefill_s(w, [t.prompt + t.gen_base for t in ts]), GEN)

    # ---------------------------------------------------------------- handlers
    def _on_chunk(self, w: SimWorker):
        self._advance(w, w.chunk.n)
        w.chunk = None
        finished = []
        while w.heap and w.heap[0].step <= w.steps:
            _, stint, tid = heapq.heappop(w.heap)
            t = w.batch.get(tid)
            if t is not None and t.stint == stint:
                finished.append(t)
        for t in finished:
            self._remove(w, t)
            self._finish(t)
        self._after_batch_change(w)

    def _after_batch_change(self, w: SimWorker):
        if self.interrupting:  # partial-rollout: its call has returned; it waits for the others'
            self._drained(w)
            if not self.undrained:
                self._end_drain()
            return
        if self.kind == "trajectory-async" and not w.batch and self.relay_version > w.version and not w.pulling:
            self._pull(w)
            return
        if self.kind == "stale" and self.sync_pending:
            self._start_chunk(w)
            self._maybe_broadcast()
            return
        self._dispatch([w])
        self._start_chunk(w)
        if self.kind in ("sync", "one-step-off"):
            self._maybe_next_round()

    def _finish(self, t: SimTraj):
        self.times[t.id, FINISH] = self.now
        self.buffer.append(t)
        if self.kind in ("sync", "one-step-off"):
            self.round_done[t.round] = self.round_done.get(t.round, 0) + 1
        self._maybe_train()

    def _pull(self, w: SimWorker):
        w.pulling = True
        self._pause(w, w.c.pull_s, SYNC)
        w.pull_to = self.relay_version

    def _on_resume(self, w: SimWorker):
        w.paused_until = -1.0
        if w.pulling:
            w.pulling = False
            w.version = w.pull_to
        self._after_batch_change(w)

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        w = self.job.rollout.workload
        self._mean_ctx = (w.max_prompt() if isinstance(w.prompt_len, int) else w.prompt_len.mean(w.max_prompt())) + \
            w.response.mean(w.max_len) / 2
        est = self._estimate_step_s()
        self.sample_dt = max(est / 20, est * self.steps_target / 500, 1e-3)  # ≤ ~500 samples per ideal run
        self._push(0.0, "sample")
        if self.kind == "trajectory-async" and self.repack_method != "none":
            self._push(self.job.rollout.repack.interval_s, "tick")
        self._dispatch()
        for wk in self.workers:
            self._start_chunk(wk)
        while self.events and self.trained < self.steps_target:
            t, _, kind, payload = heapq.heappop(self.events)
            self.now = t
            if t - self.t_end > 200 * est + 1e3:  # only periodic events left: a rule never releases work
                break
            if kind == "chunk":
                wk = self.workers[payload[0]]
                if payload[1] == wk.epoch and wk.chunk is not None:
                    self._on_chunk(wk)
            elif kind == "resume":
                wk = self.workers[payload[0]]
                if payload[1] == wk.epoch:
                    self._on_resume(wk)
            elif kind == "train_done":
                if payload[0] != self.train_epoch:  # re-timed since (_retime_train)
                    continue
                self._on_train_done()
                if self.kind == "stale":
                    self._maybe_broadcast()
            elif kind == "trainer_free":
                self._maybe_train()
            elif kind == "bcast_done":
                self._on_bcast_done(payload[0])
            elif kind == "relay":
                self._on_relay(payload[0])
            elif kind == "tick":
                self._on_tick()
            elif kind == "sample":
                self._sample_kv()
                self._push(self.now + self.sample_dt, "sample")
        if self.trained < self.steps_target:
            raise RuntimeError(f"simulation of {self.variant} stalled after {self.trained} of {self.steps_target} "
                               f"steps at t={self.now:.1f}s (no events left): a policy rule never releases work")
        return self._result(time.perf_counter() - wall0)

    def _estimate_step_s(self) -> float:
        w = self.job.rollout.workload
        rate = sum(wk.c.full_rate(min(self.cap, max(1, self.B // len(self.workers))), self._mean_ctx)
                   for wk in self.workers)
        return self.B * w.response.mean(w.max_len) / rate


def simulate(job, variant: str | None = None, *, costs: list | None = None, sync: SyncCosts | None = None,
             steps: int | None = None, timeline_until: float | None = None, train_s=None,
             backend: str | None = None) -> SimResult:
    """Simulate `job` under `variant` (one of VARIANTS; default: the spec's policy and repack).

    `costs` / `sync` / `train_s` replace the modelled costs (e.g. by ones calibrated from a real run);
    `timeline_until` keeps per-worker state segments up to that simulated second (for the PNG).
    """
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    return Simulator(job, variant, costs, sync, steps, timeline_until, train_s, backend=backend).run()
