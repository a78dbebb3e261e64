"""The driver of the real run: one policy variant applied to live Ray actors, in wall-clock time.

It applies the same policy rules as the simulator (rollout.simulate), with the same drawn lengths:
admission gates, barrier rounds, stale syncs, partial-rollout interrupts, relay pulls; it drops a
dead actor (its in-flight trajectories go back to the queue) and logs every call, broadcast, pull
and trainer step for rollout.calibrate. Repacking between live actors is rollout.driver_repack.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from qsync_opt.rollout.actors import model_dict
from qsync_opt.rollout.driver_repack import repack_tick
from qsync_opt.rollout.sim_policies import next_micro_batch
from qsync_opt.rollout.simulate import Simulator

MAX_STEPS_PER_CALL = 16
"""Decode steps an actor runs per call before reporting back (bounds the driver's reaction time)."""


@dataclass
class RunResult:
    variant: str
    steps: int
    wall_s: float
    trajectories_per_s: float
    tokens_per_s: float
    rollout_idle_frac: float
    trainer_idle_frac: float
    staleness_mean: float
    staleness_max: int
    repacks: int
    moves: int
    trained_ids: list[int] = field(repr=False, default_factory=list)
    lost_actors: list[int] = field(default_factory=list)
    logs: dict = field(repr=False, default_factory=dict)


class Driver:
    """Applies one policy variant with real actors (the simulator's rules, wall-clock time)."""

    def __init__(self, job, variant: str, actors, trainer, kill_after_steps: int | None = None, seed: int = 0):
        self.job, self.variant = job, variant
        plan = Simulator(job, variant)  # the same rules' parameters and the same drawn lengths
        self.kind, self.repack_method, self.eta, self.B = plan.kind, plan.repack_method, plan.eta, plan.B
        self.micro_batches = plan.micro_batches  # the trainer's per step (1 under the barrier policies)
        self.prompts, self.targets, self.n_max = plan.prompts, plan.targets, plan.n_max
        self.cap = job.rollout.repack.batch_cap
        self.steps_target = job.rollout.steps
        self.actors, self.trainer = list(actors), trainer
        self.alive = set(range(len(self.actors)))
        self.kill_after_steps = kill_after_steps
        self.rng = np.random.RandomState(seed)
        self.vocab = model_dict(job)["vocab"]

    # trajectories: id -> dict(prompt tokens, target total length, version, worker)
    def _new(self):
        i = self.next_id
        self.next_id += 1
        rs = np.random.RandomState(10_000 + i // self.job.rollout.workload.group_size)
        prompt = rs.randint(0, self.vocab, size=int(self.prompts[i])).tolist()
        self.trajs[i] = {"prompt": prompt, "target": int(self.prompts[i]) + int(self.targets[i]), "version": None,
                         "worker": None, "round": i // self.B}
        return i

    def _gate(self):
        if self.kind in ("sync", "one-step-off"):
            return (self.round + 1) * self.B
        return min(self.n_max, (self.eta + self.version + 1) * self.B)

    def _may_admit(self, i):
        a = self.w[i]
        if i not in self.alive or a["loading"]:
            return False
        if self.kind == "stale" and self.sync_pending:
            return False
        if self.kind == "partial-rollout" and self.interrupt_pending:
            return False
        if self.kind == "trajectory-async":
            return self.relay_version - a["version"] < self.eta
        return True

    def _dispatch(self, only=None):
        import heapq

        cands = [i for i in (only if only is not None else sorted(self.alive)) if self._may_admit(i)]
        heap = [(len(self.w[i]["inflight"]), i) for i in cands]
        heapq.heapify(heap)
        batches: dict[int, list] = {}
        while heap:
            if self.queue:
                tid = self.queue[0]
            elif self.next_id < self._gate():
                tid = self._new()
                self.queue.append(tid)
            else:
                break
            n, i = heapq.heappop(heap)
            if n >= self.cap:
                continue
            self.queue.pop(0)
            t = self.trajs[tid]
            if t["version"] is None:
                t["version"] = self.w[i]["version"] if self.kind == "trajectory-async" else self.rollout_version
            t["worker"] = i
            self.w[i]["inflight"].add(tid)
            batches.setdefault(i, []).append((tid, t.get("ctx") or t["prompt"], t["target"]))
            t.pop("ctx", None)
            heapq.heappush(heap, (n + 1, i))
        for i, items in batches.items():
            self.w[i]["to_admit"] += items
            self._issue(i)

    def _issue(self, i):
        a = self.w[i]
        if a["call"] is None and a["inflight"] and i in self.alive and not a["loading"]:
            # processes computing at once on the host's shared cores: the actors decoding and the trainer
            busy = 1 + sum(self.w[j]["call"] is not None for j in self.alive) + (self.train_call is not None)
            ref = self.actors[i].step.remote(MAX_STEPS_PER_CALL, a["to_admit"], busy)
            a["to_admit"] = []
            a["call"] = ref
            self.pending[ref] = ("step", i)
            a["issued"] = time.perf_counter()

    def _drop_actor(self, i):
        """A dead actor: its in-flight trajectories go back to the queue, to be generated again."""
        self.alive.discard(i)
        self.lost.append(i)
        a = self.w[i]
        for tid in sorted(a["inflight"]):
            t = self.trajs[tid]
            t["worker"], t["version"] = None, None
            t.pop("ctx", None)
            self.queue.insert(0, tid)
        a["inflight"].clear()
        a["to_admit"] = []
        a["call"] = None

    def _wait_all(self, refs):
        import ray

        out = {}
        for i, r in refs.items():
            try:
                out[i] = ray.get(r)
            except ray.exceptions.RayActorError:
                self._drop_actor(i)
        return out

    def _drain_calls(self, idxs):
        """Wait for the outstanding step calls of `idxs` and handle their results (no new calls)."""
        import ray

        for i in idxs:
            ref = self.w[i]["call"]
            if ref is None:
                continue
            self.pending.pop(ref, None)
            self.w[i]["call"] = None
            try:
                res = ray.get(ref)
            except ray.exceptions.RayActorError:
                self._drop_actor(i)
                continue
            self._account(i, res)

    def _account(self, i, res):
        a = self.w[i]
        a["gen_time"] += res["elapsed"]
        now = time.perf_counter()  # (driver overhead, steps, issued, returned): an actor is busy from issue to return
        self.call_log.append((now - a["issued"] - res["elapsed"], res["steps"], a["issued"], now))
        for tid, tokens in res["finished"]:
            a["inflight"].discard(tid)
            self.buffer.append((tid, tokens))
            self.round_done[self.trajs[tid]["round"]] = self.round_done.get(self.trajs[tid]["round"], 0) + 1

    def _broadcast(self, ref, version):
        t0 = time.perf_counter()
        refs = {i: self.actors[i].load.remote(version, ref) for i in sorted(self.alive)}
        self._wait_all(refs)
        self.bcast_log.append(time.perf_counter() - t0)
        self.rollout_version = version
        for i in self.alive:
            self.w[i]["version"] = version

    def _maybe_train(self):
        if self.train_call is not None or self.trained_steps + (self.train_call is not None) >= self.steps_target:
            return
        if self.kind in ("sync", "one-step-off"):
            k = self.trained_steps
            if self.round_done.get(k, 0) < self.B:
                return
            if self.kind == "one-step-off" and self.rollout_version < k:
                return
            batch = [(tid, tok) for tid, tok in self.buffer if self.trajs[tid]["round"] == k]
            self.buffer = [(tid, tok) for tid, tok in self.buffer if self.trajs[tid]["round"] != k]
            self._train(batch, last=True)
            return
        part = next_micro_batch(self.step_got, self.buffer, self.B, self.micro_batches, self.step_done,
                                key=lambda x: (self.trajs[x[0]]["version"], x[0]))
        if part is not None:
            self._train(part, last=self.step_done + 1 == self.micro_batches)

    def _train(self, batch, last: bool):
        """Issue the trainer's call on `batch`: its step's last micro-batch (or whole batch) ends the step."""
        for tid, _ in batch:
            self.staleness.append(self.version - self.trajs[tid]["version"])
            self.trained_ids.append(tid)
        self.tokens += sum(self.trajs[tid]["target"] - len(self.trajs[tid]["prompt"]) for tid, _ in batch)
        seqs = [tok for _, tok in batch]
        plens = [len(self.trajs[tid]["prompt"]) for tid, _ in batch]
        # the trainer computes a padded batch: trajectories x the longest of them (TrainerActor._backward)
        self.train_tokens = len(seqs) * max(len(x) for x in seqs)
        self.train_gen = sum(self.w[j]["call"] is not None for j in self.alive)  # actors decoding beside it
        self.train_last = last
        self.train_call = (self.trainer.train if last else self.trainer.accumulate).remote(seqs, plens)
        self.pending[self.train_call] = ("train", None)
        self.train_started = time.perf_counter()

    def _next_round(self):
        """Barrier policies: open round r + 1 once round r is generated (broadcasting first if needed)."""
        r = self.round
        if self.round_done.get(r, 0) < self.B or r + 1 >= self.steps_target:
            if self.kind == "one-step-off" and self.rollout_version < self.version == r and self.train_call is None \
                    and self.round_done.get(r, 0) >= self.B:
                self._broadcast(self.latest_ref, self.version)
            return
        need = r + 1 if self.kind == "sync" else r
        if self.rollout_version < need:
            if self.version >= need and self.train_call is None:
                self._broadcast(self.latest_ref, self.version)
            else:
                return
        self.round += 1
        self._dispatch()

    def _repack_tick(self):
        repack_tick(self)

    def _pull(self, i):
        a = self.w[i]
        if a["loading"] or a["version"] >= self.relay_version or i not in self.alive:
            return
        a["loading"] = True
        ref = self.actors[i].load.remote(self.relay_version, self.latest_ref)
        self.pending[ref] = ("load", i)
        a["load_to"] = self.relay_version
        a["load_issued"] = time.perf_counter()

    def run(self) -> RunResult:
        import ray

        n = len(self.actors)
        self.w = [{"inflight": set(), "version": 0, "call": None, "loading": False, "gen_time": 0.0, "load_to": 0,
                   "to_admit": []} for _ in range(n)]
        self.call_log, self.bcast_log, self.pull_log, self.train_log = [], [], [], []
        self.interrupt_log = []  # partial-rollout: [version seen, calls returned, contexts out, broadcast done]
        # train_log: (padded tokens: trajectories x the longest, wall seen by the driver, trainer CPU s, trainer start,
        # driver issue, actors decoding at issue, the trainer's own wall s incl. publishing the weights, the optimizer
        # step and publishing s, whether the call ended its step), one per trainer call (a micro-batch or a step)
        self.trajs, self.queue, self.buffer = {}, [], []
        self.next_id = self.round = self.version = self.rollout_version = self.relay_version = 0
        self.round_done, self.pending = {}, {}
        self.train_call, self.trained_steps, self.trained_ids, self.staleness, self.tokens = None, 0, [], [], 0
        self.step_got, self.step_done, self.train_last = [], 0, True
        self.sync_pending = self.interrupt_pending = False
        self.repacks = self.moves = 0
        self.lost = []
        self.latest_ref = None
        self.train_time = 0.0
        interval = self.job.rollout.repack.interval_s
        t_start = time.perf_counter()
        cpu_start = time.process_time()
        last_tick = t_start
        t_end = t_start
        self._dispatch()
        while self.trained_steps < self.steps_target:
            if not self.pending:
                raise RuntimeError(f"real run of {self.variant} stalled after {self.trained_steps} steps")
            ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=max(0.01, interval))
            if self.repack_method != "none" and time.perf_counter() - last_tick >= interval:
                last_tick = time.perf_counter()
                self._repack_tick()
            for ref in ready:
                if ref not in self.pending:
                    continue
                what, i = self.pending.pop(ref)
                if what == "step":
                    self.w[i]["call"] = None
                    try:
                        res = ray.get(ref)
                    except ray.exceptions.RayActorError:
                        self._drop_actor(i)
                        self._dispatch()
                        continue
                    self._account(i, res)
                    self._after_step(i)
                elif what == "load":
                    a = self.w[i]
                    a["loading"] = False
                    try:
                        ray.get(ref)
                        a["version"] = a["load_to"]
                        self.pull_log.append(time.perf_counter() - a["load_issued"])
                    except ray.exceptions.RayActorError:
                        self._drop_actor(i)
                    self._dispatch([i])
                    self._issue(i)
                elif what == "train":
                    got = ray.get(ref)
                    version, wref, _, cpu, t0, own, publish = got if self.train_last else (None, None, None, *got, 0.0)
                    self.train_time += time.perf_counter() - self.train_started
                    self.train_log.append((self.train_tokens, time.perf_counter() - self.train_started, cpu, t0,
                                           self.train_started, self.train_gen, own, publish, self.train_last))
                    self.train_call = None
                    if not self.train_last:  # a micro-batch: the step goes on with the next once it is in
                        self.step_done += 1
                        self._maybe_train()
                        continue
                    self.step_got, self.step_done = [], 0
                    self.trained_steps += 1
                    self.version = version
                    self.latest_ref = wref
                    t_end = time.perf_counter()
                    if self.kill_after_steps is not None and self.trained_steps == self.kill_after_steps:
                        victim = max(self.alive, key=lambda j: (len(self.w[j]["inflight"]), -j))
                        ray.kill(self.actors[victim], no_restart=True)
                        self.kill_after_steps = None
                    if self.trained_steps < self.steps_target:
                        self._on_publish()
                    self._maybe_train()
        wall = t_end - t_start
        self.driver_cpu_s = time.process_time() - cpu_start
        self.t_start, self.t_end = t_start, t_end
        gen = sum(self.w[i]["gen_time"] for i in range(n))
        return RunResult(self.variant, self.trained_steps, wall, self.trained_steps * self.B / wall, self.tokens / wall,
                         1 - gen / (n * wall), 1 - self.train_time / wall, float(np.mean(self.staleness)),
                         int(max(self.staleness)), self.repacks, self.moves, self.trained_ids, self.lost)

    def _after_step(self, i):
        k = self.kind
        self._maybe_train()
        if k == "trajectory-async" and not self.w[i]["inflight"] and self.relay_version > self.w[i]["version"]:
            self._pull(i)
            return
        if k == "stale" and self.sync_pending:
            if not any(self.w[j]["inflight"] for j in self.alive) and self.train_call is None:
                self._finish_stale_sync()
            else:
                self._issue(i)
            return
        if k == "partial-rollout" and self.interrupt_pending:
            if all(self.w[j]["call"] is None for j in self.alive):
                self._finish_interrupt()
            return
        self._dispatch([i])
        self._issue(i)
        if k in ("sync", "one-step-off"):
            self._next_round()
            self._maybe_train()

    def _on_publish(self):
        k = self.kind
        if k in ("sync", "one-step-off"):
            self._next_round()
        elif k == "stale":
            self.sync_pending = True
            if not any(self.w[j]["inflight"] for j in self.alive):
                self._finish_stale_sync()
        elif k == "partial-rollout":
            self.interrupt_pending = True
            self.interrupt_log.append([time.perf_counter()])
            if all(self.w[j]["call"] is None for j in self.alive):
                self._finish_interrupt()
        else:
            self.relay_version = self.version
            for i in sorted(self.alive):
                if not self.w[i]["inflight"]:
                    self._pull(i)
            self._dispatch()

    def _finish_stale_sync(self):
        self._broadcast(self.latest_ref, self.version)
        self.sync_pending = False
        self._dispatch()
        for i in sorted(self.alive):
            self._issue(i)
        self._maybe_train()

    def _finish_interrupt(self):
        """partial-rollout: take every in-flight trajectory out, broadcast, re-prefill them in place."""
        rec = self.interrupt_log[-1] if self.interrupt_log else [time.perf_counter()]
        rec.append(time.perf_counter())  # every call has returned
        queued = {tid for i in self.alive for tid, _, _ in self.w[i]["to_admit"]}  # not on the actor yet
        got = self._wait_all({i: self.actors[i].extract.remote(sorted(self.w[i]["inflight"] - queued))
                              for i in sorted(self.alive) if self.w[i]["inflight"] - queued})
        rec.append(time.perf_counter())  # the contexts are out
        self._broadcast(self.latest_ref, self.version)
        rec.append(time.perf_counter())  # the broadcast is done
        self.interrupt_pending = False
        for i, ctxs in got.items():
            if i in self.alive and ctxs:
                self.w[i]["to_admit"] += [(tid, tok, self.trajs[tid]["target"]) for tid, tok in ctxs.items()]
        self._dispatch()
        for i in sorted(self.alive):
            self._issue(i)
        self._maybe_train()
