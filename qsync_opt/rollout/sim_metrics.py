"""What the simulator measures: the KV-use samples and the run's SimResult (throughput, idle, sync
and migrate fractions, staleness, repack counts and solver wall times, the per-worker timeline).

`Metrics` is a mixin of rollout.simulate.Simulator (it reads the simulator's state).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qsync_opt.rollout.bounds_staleness import least_latencies, staleness_run_ceiling
from qsync_opt.rollout.sim_records import ADMIT, FINISH, FIRST, GEN, MIGRATE, STATES, STEP_END, STEP_START, SYNC


MEASURED = ("wall_s", "solver_wall_ms_mean", "solver_wall_ms_max")
"""SimResult fields timed on this machine rather than simulated."""


@dataclass
class SimResult:
    variant: str
    steps: int
    sim_time_s: float
    trajectories_per_s: float
    tokens_per_s: float
    rollout_idle_frac: float
    """1 − the rollouts' generating fraction (idle + syncing + migrating). On a shared host (a calibrated run) the
    driver's round trip of each decode call is not generating either, as the real run counts it (an actor generates
    from a call's start to its return, rollout.driver): the timeline draws the trip inside the call."""
    rollout_sync_frac: float
    rollout_migrate_frac: float
    trainer_idle_frac: float
    staleness_mean: float
    staleness_max: int
    kv_util_mean: float
    """Mean over time and workers of KV in use / KV capacity."""
    repacks: int
    moves: int
    repack_overhead_s: float
    """Rollout-seconds spent migrating (summed over receivers) plus decision latency."""
    solver_wall_ms_mean: float
    solver_wall_ms_max: float
    wall_s: float
    """Seconds this simulation took on this machine."""
    kv_series: list[tuple[float, float]] = field(default_factory=list, repr=False)
    timeline: list[list[tuple[float, float, str]]] = field(default_factory=list, repr=False)
    """Per worker: (start, end, state) segments up to `timeline_until`."""
    worker_labels: list[str] = field(default_factory=list, repr=False)
    rollout_reprefill_frac: float = 0.0
    """Share of rollout time re-prefilling interrupted trajectories after a weight sync (partial-rollout); it is
    counted as generating in rollout_idle_frac, but it produces no token."""
    repack_clock_stops: int = 0
    """Repack solves stopped by the clock (rollout.sim_repack.SIM_HANG_S): 0 means the run is deterministic."""
    tail_extension_s: float = 0.0
    """Σ over repack receivers of how much later each drains (its longest remaining trajectory grew), seconds."""
    gate_fill_mean: float | None = None
    """Mean over the run of the staleness rule's room in use: (admitted − trained·batch) / ((η + 1)·batch), the exact
    time integral (the sum of the four room_* shares). Near 1, the rule, not the rollouts, holds back admission. None
    for the barrier policies (sync, one-step-off)."""
    gate_waiting_mean: float | None = None
    """Of that room, the mean share held by finished trajectories waiting for their trainer step to start."""
    room_queued_mean: float | None = None
    """Of that room, the share held by admitted trajectories not yet placed on a worker."""
    room_decoding_mean: float | None = None
    """Of that room, the share held by trajectories from their placement (prefill included) to their last token."""
    room_training_mean: float | None = None
    """Of that room, the share held by the batch the trainer is on (trained counts at the step's end)."""
    latency_s_mean: float | None = None
    """Mean over the trained trajectories of placement → last token, seconds."""
    wait_s_mean: float | None = None
    """Mean over the trained trajectories of last token → the start of their trainer step, seconds."""
    latency_stretch: float | None = None
    """Σ latency / Σ least latency over the trained trajectories, the least being what the gate of
    rollout.bounds_staleness prices (prefill and every step alone on the quickest kind): how much slower they decoded
    than the ceiling lets them. None on a calibrated shared host (the bound does not cover its costs)."""
    stale_over_eta_frac: float | None = None
    """Share of the trained trajectories whose staleness exceeds η (policy.eta, default 1): the rule bounds admission,
    not when a trajectory finishes, so a long one overtaken by shorter ones is trained later. None for the barrier
    policies (sync, one-step-off), whose staleness is fixed."""
    ceiling_tps: float | None = None
    """The proven ceiling of this run under its staleness rule (rollout.bounds_staleness.staleness_run_ceiling over
    the trajectories it trained and those it could admit): no schedule of them obeying the rule trains faster. None on
    a calibrated shared host, whose costs the bound does not cover."""
    decode_batch_mean: float = 0.0
    """Mean over time of the sequences decoding on a worker that holds any (sampled with the KV use)."""
    decode_stretch_mean: float = 0.0
    """Mean over time and in-flight sequences of (the decode step each one is in, at its worker's batch and contexts)
    / (a step of that sequence alone on the quickest kind): how much slower a token decodes than the single-sequence
    latency rollout.bounds_staleness's gate prices it at (1.0: no slower)."""

    def at_least_latency_tps(self) -> float | None:
        """What-if, not a bound: this run's throughput had its trajectories decoded at their least latency
        (latency_stretch 1), the room as full and the rest as it was. By Little's law on the rule's room, a trained
        trajectory holds it for its queue, latency, wait and step, in the shares q, d, w, t of the room: at the same
        fill the throughput scales by (q + d + t) / (q + d / stretch + t), the wait for a batch staying the same share
        of the step period. None where the run has no such split or stretch."""
        if self.latency_stretch is None or self.room_decoding_mean is None:
            return None
        q, d, t = self.room_queued_mean, self.room_decoding_mean, self.room_training_mean
        return self.trajectories_per_s * (q + d + t) / (q + d / self.latency_stretch + t)

    def row(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("kv_series", "timeline", "worker_labels")}

    def simulated(self) -> dict:
        """`row()` without the figures this machine measured (the simulator's and its solver's wall times): what a
        deterministic simulation must reproduce, value for value."""
        return {k: v for k, v in self.row().items() if k not in MEASURED}


class Metrics:
    """KV sampling and the result of rollout.simulate.Simulator (a mixin of it)."""

    def _steps_now(self, w) -> int:
        """Decode steps worker `w` has made by now, the chunk in progress included."""
        k = w.steps
        if w.chunk is not None:
            t0, dt, n = w.chunk
            k += min(n, int((self.now - t0) / dt)) if dt > 0 else 0
        return k

    def _sample_kv(self):
        used = cap = 0.0
        for w in self.workers:
            k = self._steps_now(w)
            used += w.total_ctx(k) if w.batch else 0.0
            cap += w.c.kv_capacity_tokens
        self.kv_series.append((self.now, used / cap))
        seqs = stretch = 0.0
        busy = 0
        for w in self.workers:
            if not w.batch:
                continue
            b = len(w.batch)
            ctx = w.total_ctx(self._steps_now(w))
            alone = min(c.decode_ms(1, ctx / b) for c in self.kinds)
            busy += 1
            seqs += b
            stretch += b * w.c.decode_ms(b, ctx) / alone if alone > 0 else 0.0
        if busy:
            self.batch_series.append((self.now, seqs / busy, stretch / seqs))

    def _result(self, wall) -> SimResult:
        T = self.t_end
        self.now = T
        for w in self.workers:
            self._set_state(w, "_end")
            w.totals.pop("_end", None)
        n = len(self.workers)
        tot = {s: sum(w.totals.get(s, 0.0) for w in self.workers) for s in STATES}
        gen = tot[GEN]
        kv = [u for t, u in self.kv_series if t <= T]
        walls = self.solver_walls or [0.0]
        return SimResult(
            variant=self.variant, steps=self.trained, sim_time_s=T,
            trajectories_per_s=self.trained * self.B / T, tokens_per_s=self.tokens_trained / T,
            rollout_idle_frac=1 - (gen - self.trip_total) / (n * T), rollout_sync_frac=tot[SYNC] / (n * T),
            rollout_migrate_frac=tot[MIGRATE] / (n * T), trainer_idle_frac=1 - self.trainer_time / T,
            staleness_mean=float(np.mean(self.stale)), staleness_max=int(max(self.stale)),
            kv_util_mean=float(np.mean(kv)) if kv else 0.0, repacks=self.repacks, moves=self.moves,
            repack_overhead_s=self.repack_overhead, solver_wall_ms_mean=1e3 * float(np.mean(walls)),
            solver_wall_ms_max=1e3 * max(walls), wall_s=wall,
            kv_series=[(t, u) for t, u in self.kv_series if t <= T],
            timeline=[w.segments for w in self.workers], worker_labels=[w.label for w in self.workers],
            repack_clock_stops=self.repack_clock_stops, tail_extension_s=self.tail_extension_s,
            rollout_reprefill_frac=self.reprefill_s / (n * T), ceiling_tps=self._ceiling_tps(),
            **self._room(T),
            stale_over_eta_frac=None if self.kind in ("sync", "one-step-off") else
            float(np.mean([s > self.eta for s in self.stale])),
            decode_batch_mean=self._batch_mean(1, T), decode_stretch_mean=self._batch_mean(2, T))

    def _batch_mean(self, k: int, T: float) -> float:
        xs = [g[k] for g in self.batch_series if g[0] <= T]
        return float(np.mean(xs)) if xs else 0.0

    def _room(self, T: float) -> dict:
        """The staleness rule's room over [0, T], split by where each admitted trajectory is (exact integrals of the
        per-trajectory times), and the trained trajectories' latency and wait."""
        if self.kind in ("sync", "one-step-off"):
            return {}
        x = self.times[:self.next_id]
        cols = [np.minimum(x[:, ADMIT], T)]
        for c in (FIRST, FINISH, STEP_START, STEP_END):  # NaN: not yet, so the phase before lasts to T
            cols.append(np.clip(np.nan_to_num(x[:, c], nan=T), cols[-1], T))
        share = [float((b - a).sum()) / (T * (self.eta + 1) * self.B) for a, b in zip(cols, cols[1:])]
        done = ~np.isnan(x[:, STEP_END])
        lat = x[done, FINISH] - x[done, FIRST]
        out = dict(gate_fill_mean=sum(share), room_queued_mean=share[0], room_decoding_mean=share[1],
                   gate_waiting_mean=share[2], room_training_mean=share[3],
                   latency_s_mean=float(lat.mean()), wait_s_mean=float((x[done, STEP_START] - x[done, FINISH]).mean()))
        if not self.shared_host:
            least = least_latencies(self.job, (self.prompts, self.targets), self.kinds)[:self.next_id][done]
            out["latency_stretch"] = float(lat.sum() / least.sum())
        return out

    def _ceiling_tps(self) -> float | None:
        if self.shared_host or getattr(self.train_s, "padded", False):
            return None

        kinds = list({id(w.c): w.c for w in self.workers}.values())
        return staleness_run_ceiling(self.job, self.consumed, (self.prompts, self.targets), self.eta, costs=kinds,
                                     train_s=self.train_given, micro_batches=self.micro_batches).tps
