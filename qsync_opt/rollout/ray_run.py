"""The real run: Ray actors as rollout workers and trainer, weights through Ray's object store.

Each rollout actor holds a small random-weight decoder (torch) with a real KV cache per slot; it
prefills admitted prompts (or, for a migrated or interrupted trajectory, its prompt + response so
far: re-prefill) and decodes its batch step by step; a trajectory stops at its length drawn from the
workload (random weights never emit an end token). The trainer actor takes finished trajectories,
does a real AdamW step (policy-gradient-weighted next-token loss) and publishes each version once
with `ray.put` — the object store is the relay tier: a rollout pulls a version by fetching that
object. The driver applies the same policy rules as the simulator (rollout.simulate), with the
same drawn lengths. Every decode step, prefill, trainer step and weight pull is timed; `calibrate`
fits the simulator's costs to them, so the simulator can be checked against the run.

A rollout actor that dies mid-run (killed, crashed) is dropped: its in-flight trajectories go back
to the queue and are generated again from their prompts; none is lost or trained twice.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from qsync_opt.errors import SpecError

REPROFILL_STEPS_PER_TOKEN = 0.01
"""Repack price of moving one context token (re-prefill), in decode steps of the destination."""
MAX_STEPS_PER_CALL = 16
"""Decode steps an actor runs per call before reporting back (bounds the driver's reaction time)."""


def _need_ray():
    try:
        import ray
    except ImportError:
        raise SpecError("the real rollout run needs Ray: pip install 'ray>=2.9' (or qsync-opt[rollout]); "
                        "`qsync-opt solve` and the simulator do not") from None
    return ray


# --------------------------------------------------------------------------- the model
def _build_model(cfg, seed: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    d, heads, layers, vocab, ctx = cfg["hidden"], cfg["heads"], cfg["layers"], cfg["vocab"], cfg["max_ctx"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, cfg["ffn"]), nn.GELU(), nn.Linear(cfg["ffn"], d))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

        def split(self, x):  # [B, T, d] -> [B, H, T, hd] ×3
            b, t, _ = x.shape
            return [y.view(b, t, heads, d // heads).transpose(1, 2) for y in x.chunk(3, dim=-1)]

        def forward(self, tokens):  # training: full causal attention
            t = tokens.shape[1]
            x = self.emb(tokens) + self.pos(torch.arange(t))
            for blk in self.blocks:
                q, k, v = self.split(blk.qkv(blk.ln1(x)))
                a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + blk.o(a.transpose(1, 2).reshape(x.shape))
                x = x + blk.mlp(blk.ln2(x))
            return self.head(self.ln(x))

    return Decoder()


class _Rollout:
    """Body of the rollout actor (plain class, so it can be tested without Ray)."""

    def __init__(self, idx: int, cfg: dict, cap: int, seed: int):
        import torch

        torch.set_num_threads(1)
        self.torch = torch
        self.idx, self.cfg, self.cap = idx, cfg, cap
        self.model = _build_model(cfg, seed).eval()
        h, hd = cfg["heads"], cfg["hidden"] // cfg["heads"]
        shape = (cap, h, cfg["max_ctx"], hd)
        self.K = [torch.zeros(shape) for _ in range(cfg["layers"])]
        self.V = [torch.zeros(shape) for _ in range(cfg["layers"])]
        self.slots: dict[int, dict] = {}  # tid -> {slot, tokens, target}
        self.free = list(range(cap))
        self.version = 0
        self.step_log: list[tuple[int, int, float]] = []
        self.prefill_log: list[tuple[int, float, float]] = []
        self.load_log: list[float] = []

    def load(self, version: int, state) -> float:
        t0 = time.perf_counter()
        self.model.load_state_dict(state)
        self.version = version
        dt = time.perf_counter() - t0
        self.load_log.append(dt)
        return dt

    def admit(self, items) -> float:
        """items: (tid, context tokens, target total length). Prefills each context into a free slot."""
        torch = self.torch
        t0 = time.perf_counter()
        with torch.no_grad():
            for tid, ctx, target in items:
                slot = self.free.pop()
                toks = torch.tensor(ctx, dtype=torch.long)[None]
                x = self.model.emb(toks) + self.model.pos(torch.arange(len(ctx)))
                for li, blk in enumerate(self.model.blocks):
                    q, k, v = self.model.split(blk.qkv(blk.ln1(x)))
                    self.K[li][slot, :, :len(ctx)] = k[0]
                    self.V[li][slot, :, :len(ctx)] = v[0]
                    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                    x = x + blk.o(a.transpose(1, 2).reshape(x.shape))
                    x = x + blk.mlp(blk.ln2(x))
                nxt = int(self.model.head(self.model.ln(x[:, -1])).argmax(-1))
                self.slots[tid] = {"slot": slot, "tokens": list(ctx) + [nxt], "target": target}
        dt = time.perf_counter() - t0
        if items:
            self.prefill_log.append((len(items), float(np.mean([len(c) for _, c, _ in items])), dt))
        return dt

    def reset(self, seed: int):
        self.model = _build_model(self.cfg, seed).eval()
        self.slots, self.free, self.version = {}, list(range(self.cap)), 0
        self.step_log, self.prefill_log, self.load_log = [], [], []
        return self.idx

    def step(self, max_steps: int, admit=(), busy: int = 1):
        """Prefill `admit` (tid, context, target), then decode until a trajectory reaches its length
        (or max_steps); returns finished trajectories and timings."""
        torch = self.torch
        finished, steps = [], 0
        t_call = time.perf_counter()
        if admit:
            self.admit(admit)
        with torch.no_grad():
            while self.slots and steps < max_steps:
                t0 = time.perf_counter()
                tids = list(self.slots)
                slots = torch.tensor([self.slots[t]["slot"] for t in tids])
                pos = torch.tensor([len(self.slots[t]["tokens"]) - 1 for t in tids])
                last = torch.tensor([self.slots[t]["tokens"][-1] for t in tids])
                lmax = int(pos.max()) + 1
                x = (self.model.emb(last) + self.model.pos(pos))[:, None]  # [B, 1, d]
                mask = torch.arange(lmax)[None, :] <= pos[:, None]  # [B, L]
                for li, blk in enumerate(self.model.blocks):
                    q, k, v = self.model.split(blk.qkv(blk.ln1(x)))
                    self.K[li][slots, :, pos] = k[:, :, 0]
                    self.V[li][slots, :, pos] = v[:, :, 0]
                    kb, vb = self.K[li][slots, :, :lmax], self.V[li][slots, :, :lmax]
                    a = torch.nn.functional.scaled_dot_product_attention(q, kb, vb, attn_mask=mask[:, None, None, :])
                    x = x + blk.o(a.transpose(1, 2).reshape(x.shape))
                    x = x + blk.mlp(blk.ln2(x))
                nxt = self.model.head(self.model.ln(x[:, 0])).argmax(-1).tolist()
                total = int(pos.sum()) + len(tids)
                for tid, n in zip(tids, nxt):
                    s = self.slots[tid]
                    s["tokens"].append(n)
                    if len(s["tokens"]) >= s["target"]:
                        finished.append((tid, s["tokens"]))
                        self.free.append(s["slot"])
                        del self.slots[tid]
                steps += 1
                self.step_log.append((len(tids), total, time.perf_counter() - t0, busy))
                if finished:
                    break
        return {"finished": finished, "steps": steps, "elapsed": time.perf_counter() - t_call,
                "in_flight": len(self.slots)}

    def extract(self, tids):
        """Remove trajectories (migration or interruption): their context tokens, for a re-prefill elsewhere."""
        out = {}
        for tid in tids:
            s = self.slots.pop(tid, None)
            if s is not None:
                self.free.append(s["slot"])
                out[tid] = s["tokens"]
        return out

    def progress(self):
        """tid -> tokens so far (prompt + generated) of each in-flight trajectory."""
        return {tid: len(s["tokens"]) for tid, s in self.slots.items()}

    def logs(self):
        return {"step": self.step_log, "prefill": self.prefill_log, "load": self.load_log}

    def ping(self):
        return self.idx


class _Trainer:
    def __init__(self, cfg: dict, seed: int, lr: float = 1e-4):
        import torch

        torch.set_num_threads(1)
        self.torch = torch
        self.cfg = cfg
        self.model = _build_model(cfg, seed)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.log: list[tuple[int, float]] = []
        self.version = 0

    def reset(self, seed: int):
        self.__init__(self.cfg, seed)
        return True

    def weights(self):
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def train(self, seqs, prompt_lens):
        """One real optimizer step on finished trajectories; returns [version, ref] (ref: the new weights
        in the object store, published once: the relay)."""
        import ray

        torch = self.torch
        t0 = time.perf_counter()
        n = max(len(s) for s in seqs)
        toks = torch.zeros(len(seqs), n, dtype=torch.long)
        mask = torch.zeros(len(seqs), n)
        for i, (s, p) in enumerate(zip(seqs, prompt_lens)):
            toks[i, :len(s)] = torch.tensor(s)
            mask[i, p:len(s)] = 1.0
        lengths = torch.tensor([len(s) for s in seqs], dtype=torch.float)
        adv = (lengths - lengths.mean()) / (lengths.std() + 1e-6)  # a stand-in reward: GRPO-style normalised
        logits = self.model(toks[:, :-1])
        logp = torch.log_softmax(logits, -1).gather(-1, toks[:, 1:, None])[..., 0]
        loss = -(adv[:, None] * logp * mask[:, 1:]).sum() / mask.sum()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.version += 1
        ref = ray.put(self.weights())
        dt = time.perf_counter() - t0
        self.log.append((int(sum(len(s) for s in seqs)), dt))
        return [self.version, ref, float(loss)]

    def logs(self):
        return self.log


# --------------------------------------------------------------------------- the driver
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


def model_dict(job) -> dict:
    m = job.rollout.model
    w = job.rollout.workload
    return {"hidden": m.get("hidden"), "heads": m.get("heads"), "layers": m.get("layers"), "ffn": m.get("ffn"),
            "vocab": m.get("vocab"), "max_ctx": w.max_prompt() + w.max_len + 1}


class Driver:
    """Applies one policy variant with real actors (the simulator's rules, wall-clock time)."""

    def __init__(self, job, variant: str, actors, trainer, kill_after_steps: int | None = None, seed: int = 0):
        from qsync_opt.rollout.simulate import Simulator

        self.job, self.variant = job, variant
        plan = Simulator(job, variant)  # the same rules' parameters and the same drawn lengths
        self.kind, self.repack_method, self.eta, self.B = plan.kind, plan.repack_method, plan.eta, plan.B
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
            busy = 1 + sum(self.w[j]["call"] is not None for j in self.alive)  # actors decoding at once
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
        self.call_log.append((time.perf_counter() - a["issued"] - res["elapsed"], res["steps"]))
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
        else:
            if len(self.buffer) < self.B:
                return
            self.buffer.sort(key=lambda x: (self.trajs[x[0]]["version"], x[0]))
            batch, self.buffer = self.buffer[:self.B], self.buffer[self.B:]
        for tid, _ in batch:
            self.staleness.append(self.version - self.trajs[tid]["version"])
            self.trained_ids.append(tid)
        self.tokens += sum(self.trajs[tid]["target"] - len(self.trajs[tid]["prompt"]) for tid, _ in batch)
        seqs = [tok for _, tok in batch]
        plens = [len(self.trajs[tid]["prompt"]) for tid, _ in batch]
        self.train_tokens = sum(len(x) for x in seqs)
        self.train_call = self.trainer.train.remote(seqs, plens)
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
        from qsync_opt.rollout.repack import RepackState, RepackTraj, RepackWorker, repack

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
                                        move_cost_per_token=REPROFILL_STEPS_PER_TOKEN))
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
        self.trajs, self.queue, self.buffer = {}, [], []
        self.next_id = self.round = self.version = self.rollout_version = self.relay_version = 0
        self.round_done, self.pending = {}, {}
        self.train_call, self.trained_steps, self.trained_ids, self.staleness, self.tokens = None, 0, [], [], 0
        self.sync_pending = self.interrupt_pending = False
        self.repacks = self.moves = 0
        self.lost = []
        self.latest_ref = None
        self.train_time = 0.0
        interval = self.job.rollout.repack.interval_s
        t_start = time.perf_counter()
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
                    version, wref, _ = ray.get(ref)
                    self.train_time += time.perf_counter() - self.train_started
                    self.train_log.append((self.train_tokens, time.perf_counter() - self.train_started))
                    self.train_call = None
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
        queued = {tid for i in self.alive for tid, _, _ in self.w[i]["to_admit"]}  # not on the actor yet
        got = self._wait_all({i: self.actors[i].extract.remote(sorted(self.w[i]["inflight"] - queued))
                              for i in sorted(self.alive) if self.w[i]["inflight"] - queued})
        self._broadcast(self.latest_ref, self.version)
        self.interrupt_pending = False
        for i, ctxs in got.items():
            if i in self.alive and ctxs:
                self.w[i]["to_admit"] += [(tid, tok, self.trajs[tid]["target"]) for tid, tok in ctxs.items()]
        self._dispatch()
        for i in sorted(self.alive):
            self._issue(i)
        self._maybe_train()


def start_ray(num_cpus: int = 2):
    ray = _need_ray()
    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return ray


def make_actors(job, seed: int = 0):
    """One rollout actor per rollout device of the job, and the trainer; all start from the same weights."""
    ray = _need_ray()
    cfg = model_dict(job)
    n = sum(g.count for g in job.cluster.groups if g.name in {w.group for w in job.rollout.workers})
    R = ray.remote(num_cpus=0, max_restarts=0)(_Rollout)
    T = ray.remote(num_cpus=0)(_Trainer)
    actors = [R.remote(i, cfg, job.rollout.repack.batch_cap, seed) for i in range(n)]
    trainer = T.remote(cfg, seed)
    ray.get([a.ping.remote() for a in actors])
    return actors, trainer


def run(job, out_dir=None, variants=None, kill_after_steps: int | None = None, seed: int = 0) -> dict:
    """Run each variant for real (the same actors, reset between variants); returns variant -> RunResult
    with the timing logs (for `calibrate`), and writes out_dir/run.csv when out_dir is given."""
    from qsync_opt.rollout.simulate import VARIANTS

    ray = start_ray()
    out = {}
    actors, trainer = make_actors(job, seed)
    for v in variants or VARIANTS:
        ray.get([a.reset.remote(seed) for a in actors] + [trainer.reset.remote(seed)])
        d = Driver(job, v, actors, trainer, kill_after_steps=kill_after_steps, seed=seed)
        res = d.run()
        logs = {"rollout": [], "calls": d.call_log, "broadcast": d.bcast_log, "pull": d.pull_log, "train": d.train_log}
        for i in sorted(d.alive):
            try:
                logs["rollout"].append(ray.get(actors[i].logs.remote()))
            except ray.exceptions.RayActorError:
                pass
        res.logs = logs
        out[v] = res
        if d.lost:  # a killed actor is not reused: start the next variant on a fresh set
            for a in actors:
                ray.kill(a)
            ray.kill(trainer)
            actors, trainer = make_actors(job, seed)
    for a in actors:
        ray.kill(a)
    ray.kill(trainer)
    if out_dir is not None:
        _write_results(out, out_dir)
    return out


def _write_results(results: dict, out_dir) -> None:
    """out_dir/run.csv: one row per variant (the measured columns of RunResult)."""
    import csv
    from pathlib import Path

    p = Path(out_dir)
    p.mkdir(parents=True, exist_ok=True)
    cols = ["variant", "steps", "wall_s", "trajectories_per_s", "tokens_per_s", "rollout_idle_frac",
            "trainer_idle_frac", "staleness_mean", "staleness_max", "repacks", "moves", "lost_actors"]
    with open(p / "run.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in results.values():
            w.writerow([getattr(r, c) for c in cols])


# --------------------------------------------------------------------------- calibration
@dataclass(frozen=True)
class CalibratedCosts:
    """Costs fitted to a real run, with the interface the simulator uses (rollout.costs.WorkerCosts)."""

    group: str
    device: str
    bits: int
    count: int
    kv_capacity_tokens: float
    kv_bytes_per_token: float
    pull_s: float
    dec: tuple[float, float, float]
    """decode step ms = a + b·B + c·ΣL (one actor decoding alone)"""
    pre: tuple[float, float]
    """prefill ms per sequence = a + b·tokens"""
    share: tuple = ()
    """share[k − 1]: the (a, b, c) of decode_ms when k actors decode at once on this host's shared cores."""

    def decode_ms(self, batch, total_ctx):
        a, b, c = self.dec
        return max(1e-3, a + b * batch + c * total_ctx)

    def decode_ms_shared(self, batch, total_ctx, busy):
        """decode_ms when `busy` actors decode at once (they share this machine's cores)."""
        if not self.share:
            return self.decode_ms(batch, total_ctx)
        a, b, c = self.share[max(1, min(busy, len(self.share))) - 1]
        return max(1e-3, a + b * batch + c * total_ctx)

    def prefill_ms(self, m, tokens):
        a, b = self.pre
        return max(1e-3, m * (a + b * tokens))

    def full_rate(self, batch, mean_ctx):
        return batch / (self.decode_ms(batch, batch * mean_ctx) / 1e3)


def calibrate(job, results: dict):
    """(costs, sync, train_s) fitted to the rollouts', trainer's and loads' timings of `results`."""
    from qsync_opt.rollout.costs import SyncCosts

    steps, pre, loads, train, calls, pulls = [], [], [], [], [], []
    for r in results.values():
        for lg in r.logs["rollout"]:
            steps += lg["step"]
            pre += lg["prefill"]
        loads += r.logs["broadcast"]
        pulls += r.logs["pull"]
        train += r.logs["train"]
        calls += r.logs["calls"]
    S = np.asarray(steps, dtype=float)
    X = np.c_[np.ones(len(S)), S[:, 0], S[:, 1]]
    dec = np.linalg.lstsq(X, S[:, 2] * 1e3, rcond=None)[0]
    # the actors share this machine's cores: one fit per number k of actors decoding at once
    n_act = sum(g.count for g in job.cluster.groups if g.name in {w.group for w in job.rollout.workers})
    share = []
    for k in range(1, n_act + 1):
        sel = S[:, 3] == k
        if sel.sum() >= 30 and len(set(S[sel, 0])) >= 3:
            share.append(tuple(float(x) for x in np.linalg.lstsq(X[sel], S[sel, 2] * 1e3, rcond=None)[0]))
        else:
            share.append(share[-1] if share else tuple(float(x) for x in dec))
    share = tuple(share)
    dec = share[0]
    # what the driver waits beyond the actor's own time (Ray call, scheduling on shared cores), per step
    C = np.asarray(calls, dtype=float)
    overhead_ms = 1e3 * C[:, 0].sum() / max(1.0, C[:, 1].sum())
    dec = (float(dec[0] + overhead_ms), float(dec[1]), float(dec[2]))
    share = tuple((a + overhead_ms, b, c) for a, b, c in share)
    P = np.asarray(pre, dtype=float)
    # per-sequence prefill: dt / m against mean tokens
    pa = np.linalg.lstsq(np.c_[np.ones(len(P)), P[:, 1]], P[:, 2] * 1e3 / P[:, 0], rcond=None)[0]
    T = np.asarray(train, dtype=float)
    ta = np.linalg.lstsq(np.c_[np.ones(len(T)), T[:, 0]], T[:, 1], rcond=None)[0]
    load = float(np.median(loads)) if loads else 0.0
    pull = float(np.median(pulls)) if pulls else load
    n = sum(g.count for g in job.cluster.groups if g.name in {w.group for w in job.rollout.workers})
    costs = [CalibratedCosts("rollout", "cpu", 32, n, 1e12, 1.0, pull, dec, (float(pa[0]), float(pa[1])), share)]
    sync = SyncCosts(broadcast_s=load, push_s=0.0, relay_fanout_s=0.0, kv_link_gbs=1e-9, kv_link_latency_s=1e9)
    train_s = (lambda tokens, a=float(ta[0]), b=float(ta[1]): max(1e-3, a + b * tokens))
    return costs, sync, train_s, {"decode_ms": dec, "share_by_busy": share, "call_overhead_ms_per_step": overhead_ms,
                                  "prefill_ms_per_seq": tuple(map(float, pa)), "train_s": tuple(map(float, ta)),
                                  "broadcast_s": load, "pull_s": pull,
                                  "samples": {"steps": len(S), "prefills": len(P), "train": len(T)}}
