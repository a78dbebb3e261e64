"""The simulator's policy rules: admission gates, the trainer, relays and global broadcasts.

`PolicyRules` is a mixin of rollout.simulate.Simulator (it reads and updates the simulator's state
and calls its event and worker methods): what may be admitted now under each Policy.kind (sync,
one-step-off, stale, partial-rollout, trajectory-async), when the trainer takes a batch, and how a
new version reaches the rollouts (barrier rounds, stale drain-then-broadcast, partial-rollout
interrupts, relay pulls).
"""

from __future__ import annotations

from qsync_opt.rollout.costs import micro_batch_bounds, micro_batch_seconds
from qsync_opt.rollout.sim_records import GEN, STEP_END, STEP_START, SYNC, Chunk, SimWorker, TrainStep


def next_micro_batch(got: list, buffer: list, batch: int, micro_batches: int, done: int, key):
    """A streaming policy's trainer (the simulator's and the real run's): the step takes finished trajectories from
    `buffer` into `got`, oldest version first (`key`), up to the batch; returns what it computes next, its micro-batch
    `done` (0-based), once that is in, else None (one micro-batch: the whole batch, once it is all in)."""
    if len(got) < batch and buffer:
        buffer.sort(key=key)
        take = batch - len(got)
        got += buffer[:take]
        del buffer[:take]
    lo, hi = micro_batch_bounds(batch, micro_batches, done)
    return got[lo:hi] if len(got) >= hi else None


class PolicyRules:
    """Admission, trainer and weight-sync rules of rollout.simulate.Simulator (a mixin of it)."""

    # ---------------------------------------------------------------- admission
    def _gate(self) -> int:
        """Highest trajectory id + 1 that may be admitted now."""
        if self.kind in ("sync", "one-step-off"):
            return (self.round + 1) * self.B if self._round_open() else self.round * self.B
        return min(self.n_max, (self.eta + self.version + 1) * self.B)

    def _round_open(self) -> bool:
        lag = 0 if self.kind == "sync" else 1
        return self.rollout_version >= self.round - lag and not self.in_broadcast

    def _may_admit(self, w: SimWorker) -> bool:
        if self.now < w.paused_until or w.pulling:
            return False
        if self.kind == "stale" and (self.sync_pending or self.in_broadcast):
            return False
        if self.kind == "partial-rollout" and (self.in_broadcast or self.interrupting):
            return False
        if self.kind == "trajectory-async":
            return self.relay_version - w.version < self.eta
        return True

    # ---- trainer
    def _maybe_train(self):
        if self.trainer_busy or self.trained >= self.steps_target or self.now < self.trainer_stall_until:
            return
        if self.in_broadcast:
            return
        if self.kind in ("sync", "one-step-off"):
            k = self.trained
            if self.round_done.get(k, 0) < self.B:
                return
            if self.kind == "one-step-off" and self.rollout_version < k:
                return  # version k goes to the rollouts (round boundary broadcast) before step k trains
            batch = [t for t in self.buffer if t.round == k]
            self.buffer = [t for t in self.buffer if t.round != k]
            self.step_got, self.step_done = batch, 0
            self._compute(batch, last=True)
            return
        part = next_micro_batch(self.step_got, self.buffer, self.B, self.micro_batches, self.step_done,
                                key=lambda t: (t.version, t.id))
        if part is not None:
            self._compute(part, last=self.step_done + 1 == self.micro_batches)

    def _compute(self, part: list, last: bool):
        """The trainer computes `part` of its step (the whole batch, or one micro-batch); `last`: the step ends with it
        (the optimizer step and the weights' publishing, rollout.costs.micro_batch_seconds)."""
        self.times[[t.id for t in part], STEP_START] = self.now
        for t in part:
            self.stale.append(self.version - t.version)
        self.consumed.extend((t.prompt, t.target) for t in part)
        tokens = sum(t.prompt + t.target for t in part)
        if getattr(self.train_s, "padded", False):  # a trainer that pads what it computes to its longest (the real run)
            tokens = len(part) * max(t.prompt + t.target for t in part)
        self.tokens_trained += sum(t.target for t in part)
        self.trainer_busy = True
        self.train_epoch += 1
        self.train_last = last
        if self.shared_host and hasattr(self.train_s, "g"):
            # calibrated on a shared host: the step is slower while rollouts decode beside it, and how many do changes
            # during the step; it progresses at 1 / train_s(tokens, beside) of the step per second, re-timed at every
            # change (_retime_train), as processes sharing cores do
            self.train_ps = TrainStep(tokens, self._beside(), self.now)
            dur = self._train_seconds(tokens, self.train_ps.beside)
        else:
            self.train_ps = None
            dur = self._train_seconds(tokens)
            self.trainer_time += dur
        self._push(self.now + dur, "train_done", self.train_epoch)

    def _train_seconds(self, tokens, beside=None) -> float:
        """Seconds of what the trainer computes now (`tokens` of it; `beside`: rollouts decoding beside it on a shared
        host), alone at that rate: rollout.costs.micro_batch_seconds."""
        kw = {} if beside is None else {"beside": beside}
        return micro_batch_seconds(self.train_s, tokens, self.micro_batches, self.train_last, self.per_step_s, **kw)

    def _beside(self) -> int:
        """Rollouts decoding beside the trainer (a worker whose last trajectory just ended is not)."""
        return sum(1 for w in self.workers if w.state == GEN and w.batch)

    def _retime_train(self):
        """The number decoding beside the trainer changed: what it computes progressed so far at the old rate, the
        rest goes at the new one."""
        ps = self.train_ps
        now_beside = self._beside()
        if now_beside == ps.beside:
            return
        ps.done += (self.now - ps.since) / self._train_seconds(ps.tokens, ps.beside)
        ps.since, ps.beside = self.now, now_beside
        self.train_epoch += 1
        self._push(self.now + max(0.0, 1.0 - ps.done) * self._train_seconds(ps.tokens, now_beside), "train_done",
                   self.train_epoch)

    def _on_train_done(self):
        """The trainer finished what it computed: a micro-batch (it takes the next when that is in) or its step."""
        self.trainer_busy = False
        if self.train_ps is not None:
            self.trainer_time += self.now - self.train_ps.start
            self.train_ps = None
        if not self.train_last:
            self.step_done += 1
            self._maybe_train()
            return
        self.times[[t.id for t in self.step_got], STEP_END] = self.now  # the step's last part: all of it is computed
        self.step_got, self.step_done = [], 0
        self.trained += 1
        self.version += 1
        self.t_end = self.now
        if self.trained >= self.steps_target:
            return
        k = self.kind
        if k == "sync" or k == "one-step-off":
            self._maybe_next_round()
        elif k == "stale":
            self.sync_pending = True
            self._maybe_broadcast()
        elif k == "partial-rollout":
            self._interrupt_broadcast()
        else:
            self.trainer_stall_until = self.now + self.sync.push_s
            self._push(self.trainer_stall_until, "trainer_free")
            delay = self.sync.push_s + self.sync.relay_fanout_s
            if delay > 0:  # until the relays hold it, rollouts know only the old version and admit on it
                self._push(self.now + delay, "relay", self.version)
                self._dispatch()
            else:
                self._on_relay(self.version)
        self._maybe_train()

    def _on_relay(self, version: int):
        """A version reaches the relays: free rollouts pull it; the others drain first."""
        self.relay_version = max(self.relay_version, version)
        for wk in self.workers:
            if not wk.batch and not wk.pulling and self.now >= wk.paused_until and self.relay_version > wk.version:
                self._pull(wk)
        self._dispatch()

    # ---- global broadcast policies
    def _broadcast(self, then, before_s: float = 0.0):
        """Every rollout (and the trainer, between steps) stalls for the broadcast, after `before_s` more."""
        self.in_broadcast = True
        d = before_s + self.sync.broadcast_s
        for w in self.workers:
            self._pause(w, d, SYNC)
        self._push(self.now + d, "bcast_done", then)

    def _on_bcast_done(self, then):
        self.in_broadcast = False
        self.rollout_version = self.version
        for w in self.workers:
            w.version = self.version
        if then == "partial":
            for w in self.workers:
                if w.batch:
                    ctx = [t.prompt + t.gen_base + (w.steps - t.start_step) for t in w.batch.values()]
                    dt = self._prefill_s(w, ctx)  # long-tailed contexts: attention at Σ L²
                    self.reprefill_s += dt
                    self._pause(w, dt, GEN)
        if then == "stale":
            self.sync_pending = False
        if then == "partial" and self.interrupt_again:
            self.interrupt_again = False
            self._dispatch()
            for w in self.workers:
                self._start_chunk(w)
            self._interrupt_broadcast()
            self._maybe_train()
            return
        if then == "round":
            self.round += 1
        self._dispatch()
        for w in self.workers:
            self._start_chunk(w)
        self._maybe_train()
        if self.kind in ("sync", "one-step-off"):
            self._maybe_next_round()

    def _maybe_broadcast(self):
        """stale: once every rollout has drained and the trainer is between steps, broadcast."""
        if not self.sync_pending or self.in_broadcast or self.trainer_busy:
            return
        if any(w.batch for w in self.workers):
            return
        self._broadcast("stale")

    def _interrupt_broadcast(self):
        """partial-rollout's interrupt, as an engine runs it: control returns to the driver only between calls, so
        every rollout first finishes the call it is in (`steps_per_call` decode steps at most, cut short by a finish;
        1 for the modelled engines: the step in flight), stops admitting and waits for the others; then one round
        trip (the costs' `call_overhead_ms`) takes every in-flight context out, then the global broadcast, then
        each rollout re-prefills its contexts (_on_bcast_done). The trainer may start a step during the drain."""
        if self.interrupting or self.in_broadcast:  # a version published mid-interrupt: interrupt again after it
            self.interrupt_again = True
            return
        self.interrupting = True
        self.undrained = set()
        for w in self.workers:
            if w.chunk is not None:
                t0, dt, n = w.chunk
                k = max(1, int(getattr(w.c, "steps_per_call", 1)))
                done = min(n - 1, int((self.now - t0) / dt + 1e-9)) if dt > 0 else n - 1
                end = min(n, (done // k + 1) * k)  # the end of the call in progress
                if end < n:
                    w.chunk = Chunk(t0, dt, end)
                    w.epoch += 1
                    self._push(t0 + end * dt, "chunk", w.idx, w.epoch)
                self.undrained.add(w.idx)
            elif self.now < w.paused_until and not w.pulling:  # prefilling: its call ends with the prefill
                self.undrained.add(w.idx)
            else:
                self._drained(w)
        if not self.undrained:
            self._end_drain()

    def _drained(self, w):
        """w's call has returned during an interrupt: it waits (syncing) for the others'."""
        self._progress(w)
        w.paused_until = float("inf")
        self._set_state(w, SYNC)
        self.undrained.discard(w.idx)

    def _end_drain(self):
        self.interrupting = False
        extract = max((getattr(w.c, "call_overhead_ms", 0.0) for w in self.workers), default=0.0) / 1e3
        self._broadcast("partial", extract)

    def _maybe_next_round(self):
        """Barrier policies: open round r + 1 once round r has finished generating, broadcasting first
        if the round needs a newer version than the rollouts hold."""
        if self.in_broadcast:
            return
        r = self.round
        if self.round_done.get(r, 0) < self.B:
            return
        if r + 1 >= self.steps_target:  # no round left to open; one-step-off still owes its last broadcast
            if self.kind == "one-step-off" and self.rollout_version < self.version == r and not self.trainer_busy:
                self._broadcast("final")
            return
        need = r + 1 if self.kind == "sync" else r  # version that round r + 1 is generated with
        if self.rollout_version >= need:
            self.round += 1
            self._dispatch()
            return
        if self.version >= need and not self.trainer_busy:
            self._broadcast("round")
