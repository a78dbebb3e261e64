"""The simulator's repack tick: trajectory-async's draining rollouts of one version, repacked.

`RepackTick` is a mixin of rollout.simulate.Simulator: every `repack.interval_s` it groups the
rollouts that hold stale weights and still decode by version, asks rollout.repack which trajectories
to move (freeing pays only for workers the admissible work can fill), frees the emptied workers to
pull, and pauses receivers for the migration (re-prefill or KV transfer, plus `decision_s`). A freed rollout is valued
at its full rate over its drain, capped at how long its fresh weights stay fresh (`fresh_horizon_s`). The program's
plan does not depend on the wall clock (SIM_FULL_LIMIT, SIM_ROUNDS, SIM_HANG_S), so the simulation stays
deterministic on a loaded machine, and its work per decision is bounded.
"""

from __future__ import annotations

import math

from qsync_opt.rollout.costs import migration_s
from qsync_opt.rollout.repack import RepackState, RepackTraj, RepackWorker, repack
from qsync_opt.rollout.sim_records import MIGRATE, SimWorker


SIM_ROUNDS = 4
"""Solve-and-pack rounds of the aggregate form per simulated repack (deterministic)."""
SIM_FULL_LIMIT = 300
"""Largest trajectories × workers count the simulator solves in the full form, to its optimum; a larger state goes to
the aggregate form under SIM_ROUNDS. A bound on each decision's work, not a clock, so the simulation stays
deterministic: the full form's solve time grows steeply past it on the hybrid fleets, where those solves were nearly
all of a simulation's time (docs/rollout.md, "How long a simulation takes"). The library call (`repack`) keeps
rollout.repack.FULL_LIMIT under its clock."""
SIM_HANG_S = 120.0
"""Clock limit of a simulated repack: a hang detector only (a solve that reaches it is counted, since its plan then
depends on the machine's speed), set well above the slowest full-form solve seen on a loaded machine
(docs/rollout.md)."""


def useful_frees(waiting: int, mean_need: float, current: list[tuple[int, float]],
                 candidates: list[tuple[int, float]]) -> int:
    """Rollouts worth freeing for `waiting` admissible trajectories of `mean_need` KV tokens each (prompt + final
    length): what the up-to-date rollouts cannot take, `current` as (free batch slots, free KV tokens) each, over
    what one freed candidate would take, `candidates` as (batch cap, KV capacity) each (their mean). A rollout takes
    min(slots, KV // mean_need): counting slots alone overstates the room wherever the KV fills before the cap."""
    if waiting <= 0:
        return 0
    room = sum(min(max(0, slots), int(max(0.0, kv) // mean_need)) for slots, kv in current)
    excess = waiting - room
    if excess <= 0 or not candidates:
        return 0
    per_free = sum(min(cap, int(kv // mean_need)) for cap, kv in candidates) / len(candidates)
    return math.ceil(excess / per_free) if per_free > 0 else 0


def fresh_horizon_s(now: float, relay_version: int, eta: int) -> float:
    """Seconds a rollout freed now makes fresh tokens before its new weights are stale again: it pulls the relay's
    version and may admit only while that lags by less than η, so about η version periods (the mean period so far;
    unbounded before the first version). The value of freeing a rollout is its full rate over min(drain, this):
    counting the whole drain overvalued the slow rollouts of a hybrid fleet, whose drains run past it."""
    return eta * now / relay_version if relay_version > 0 else math.inf


class RepackTick:
    """The repack tick of rollout.simulate.Simulator (a mixin of it)."""

    def _on_tick(self):
        r = self.job.rollout.repack
        self._push(self.now + r.interval_s, "tick")
        by_version: dict[int, list[SimWorker]] = {}
        for w in self.workers:
            if w.batch and not w.pulling and self.relay_version - w.version >= self.eta and self.now >= w.paused_until:
                by_version.setdefault(w.version, []).append(w)
        for v, ws in by_version.items():
            if len(ws) < 2:
                continue
            self._repack(ws)

    def _tail_guard(self) -> bool:
        """The program repacks under RepackState.tail_guard: its objective prices a freed worker's drain but not a
        receiver's longer one, and without the guard it moved longer tails onto receivers than best-fit and lost end
        to end (docs/rollout.md, "Why the program lost end to end, and the tail guard"). Best-fit is Laminar's
        heuristic as published, without it."""
        return self.repack_method == "program"

    def _useful_frees(self, ws: list[SimWorker]) -> int:
        """How many of the draining rollouts `ws` are worth freeing: as many as the admissible work (AReaL's bound
        caps what is queued) that the up-to-date rollouts cannot take would fill. A rollout takes work up to the
        decode-batch cap and up to its free KV (admission reserves prompt + final length)."""
        a, b = self.next_id, min(self.n_max, self._gate())
        count = len(self.queue) + max(0, b - a)
        if count == 0:
            return 0
        need = sum(t.prompt + t.target for t in self.queue)
        if b > a:
            need += int(self.prompts[a:b].sum() + self.targets[a:b].sum())
        current = [(w.cap - len(w.batch), w.c.kv_capacity_tokens - w.reserved) for w in self.workers
                   if self.relay_version - w.version < self.eta and not w.pulling]
        return useful_frees(count, need / count, current, [(w.cap, w.c.kv_capacity_tokens) for w in ws])

    def _repack(self, ws: list[SimWorker]):
        useful = self._useful_frees(ws)
        if useful == 0:
            return
        for w in ws:
            self._progress(w)
        rws, trajs = [], []
        horizon = fresh_horizon_s(self.now, self.relay_version, self.eta)
        for w in ws:
            b = len(w.batch)
            step_s = w.c.decode_ms(b, w.total_ctx()) / 1e3
            rem = max(t.target - t.gen_base - (w.steps - t.start_step) for t in w.batch.values())
            mean_ctx = self._mean_ctx
            rate = w.c.full_rate(w.cap, mean_ctx)
            mig, _ = migration_s(mean_ctx, w.c, self.sync)
            # freeing w gains its full rate over its drain, but no longer than its fresh weights stay fresh
            rws.append(RepackWorker(str(w.idx), w.c.kv_capacity_tokens, w.cap,
                                    value=min(rem * step_s, horizon) * rate, move_cost_per_token=mig / mean_ctx * rate))
            for t in w.batch.values():
                g = t.gen_base + (w.steps - t.start_step)
                trajs.append(RepackTraj(str(t.id), str(w.idx), t.prompt + g, t.target - g))
        state = RepackState(rws, trajs, self.theta, max_freed=useful, tail_guard=self._tail_guard())
        # a plan that depends on the wall clock would make the simulation depend on the machine's load: the program
        # gets a deterministic budget (the full form, up to SIM_FULL_LIMIT pairs, solved to its optimum; beyond it
        # SIM_ROUNDS aggregate rounds) and a clock limit only as a hang detector; the decision's latency is charged
        # as repack.decision_s
        form = "full" if len(trajs) * len(rws) <= SIM_FULL_LIMIT else "aggregate"
        res = repack(state, method=self.repack_method, backend=self.backend, time_limit_s=SIM_HANG_S,
                     max_rounds=SIM_ROUNDS, form=form)
        if res.wall_s >= SIM_HANG_S:
            self.repack_clock_stops += 1
        self.solver_walls.append(res.wall_s)
        self.repacks += 1
        if not res.moves:
            for w in ws:
                self._start_chunk(w)
            return
        byid = {str(w.idx): w for w in ws}
        incoming: dict[str, list] = {}
        for m in res.moves:
            src = byid[m.src]
            t = src.batch[int(m.traj)]
            self._remove(src, t)
            incoming.setdefault(m.dst, []).append(t)
        self.moves += len(res.moves)
        for d, ts in incoming.items():
            w = byid[d]
            old_rem = max((t.target - t.gen_base - (w.steps - t.start_step) for t in w.batch.values()), default=0)
            new_rem = max([old_rem] + [t.target - t.gen_base for t in ts])
            step_s = w.c.decode_ms(len(w.batch) + len(ts), w.total_ctx() + sum(t.prompt + t.gen_base for t in ts)) / 1e3
            self.tail_extension_s += (new_rem - old_rem) * step_s  # the receiver drains this much later
            pause = self.job.rollout.repack.decision_s
            for t in ts:
                self._add(w, t)
                pause += migration_s(t.prompt + t.gen_base, w.c, self.sync)[0]
            self.repack_overhead += pause
            self._pause(w, pause, MIGRATE)
        for w in ws:
            if not w.batch:
                self._after_batch_change(w)
            elif w.chunk is None and self.now >= w.paused_until:
                self._start_chunk(w)
