"""Repacking between live rollout actors (the real run's repack tick).

Picks the actors that hold stale weights and still decode, asks rollout.repack which trajectories to
move so that some of them free up and can pull fresh weights, and carries the moves out: extract the
trajectories' contexts from their sources, re-prefill them on their destinations.
"""

from __future__ import annotations

import math

from qsync_opt.rollout.repack import RepackState, RepackTraj, RepackWorker, repack

REPREFILL_STEPS_PER_TOKEN = 0.01
"""Repack price of moving one context token (re-prefill), in decode steps of the destination."""


def repack_tick(self) -> None:
    """One repack tick of `self`, a rollout.driver.Driver (its state is read and updated in place)."""
    stale = [i for i in sorted(self.alive) if self.w[i]["inflight"] and not self.w[i]["loading"]
             and self.relay_version - self.w[i]["version"] >= self.eta]
    by_v: dict[int, list[int]] = {}
    for i in stale:
        by_v.setdefault(self.w[i]["version"], []).append(i)
    waiting = len(self.queue) + max(0, self._gate() - self.next_id)
    fresh_room = sum(self.cap - len(self.w[i]["inflight"]) for i in self.alive
                     if self.relay_version - self.w[i]["version"] < self.eta and not self.w[i]["loading"])
    useful = math.ceil(max(0, waiting - fresh_room) / self.cap)
    for v, idxs in by_v.items():
        if len(idxs) < 2 or useful == 0:
            continue
        self._drain_calls(idxs)
        idxs = [i for i in idxs if i in self.alive and self.w[i]["inflight"]]
        if len(idxs) < 2:
            continue
        prog = self._wait_all({i: self.actors[i].progress.remote() for i in idxs})
        rws, ts = [], []
        for i in idxs:  # value of freeing i: its drain (steps until its longest trajectory ends)
            rem = {tid: self.trajs[tid]["target"] - n for tid, n in prog.get(i, {}).items()}
            if not rem:
                continue
            rws.append(RepackWorker(str(i), 1e9, self.cap, value=float(max(rem.values())),
                                    move_cost_per_token=REPREFILL_STEPS_PER_TOKEN))
            ts += [RepackTraj(str(tid), str(i), prog[i][tid], r) for tid, r in rem.items()]
        if len(rws) < 2:
            continue
        res = repack(RepackState(rws, ts, self.job.rollout.repack.kv_threshold, max_freed=useful),
                     method=self.repack_method, backend=self.job.rollout.solver.backend,
                     time_limit_s=self.job.rollout.solver.time_limit_s)
        self.repacks += 1
        if not res.moves:
            for i in idxs:
                self._issue(i)
            continue
        by_src: dict[int, list[int]] = {}
        for m in res.moves:
            by_src.setdefault(int(m.src), []).append(int(m.traj))
        got = self._wait_all({s: self.actors[s].extract.remote(t) for s, t in by_src.items()})
        ctxs = {tid: tok for d in got.values() for tid, tok in d.items()}
        by_dst: dict[int, list] = {}
        for m in res.moves:
            tid, src, dst = int(m.traj), int(m.src), int(m.dst)
            if tid not in ctxs:
                continue  # finished meanwhile (cannot happen: calls were drained) or actor died
            self.w[src]["inflight"].discard(tid)
            self.w[dst]["inflight"].add(tid)
            self.trajs[tid]["worker"] = dst
            by_dst.setdefault(dst, []).append((tid, ctxs[tid], self.trajs[tid]["target"]))
            self.moves += 1
        for d, items in by_dst.items():
            self.w[d]["to_admit"] += items  # re-prefill on the destination, with its next step call
        for i in idxs:
            if not self.w[i]["inflight"]:
                self._pull(i)
            else:
                self._issue(i)
