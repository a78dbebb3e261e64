"""Rollout and trainer actor bodies: the small random-weight torch decoder, its per-slot KV cache.

`RolloutActor` prefills admitted contexts (prompts, or a migrated or interrupted trajectory's prompt +
response so far: re-prefill) and decodes its batch step by step, timing each step, prefill and weight
load. `TrainerActor` does a real AdamW step (policy-gradient-weighted next-token loss) on finished
trajectories, whole or micro-batch by micro-batch, and publishes each version once with
`ray.put`. Both are plain classes (testable
without Ray); rollout.ray_run wraps them as Ray actors. `model_dict` is the decoder a job's actors build.
"""

from __future__ import annotations

import time

import numpy as np

from qsync_opt.errors import SpecError


def need_ray():
    try:
        import ray
    except ImportError:
        raise SpecError("the real rollout run needs Ray: pip install 'ray>=2.9' (or qsync-opt[rollout]); "
                        "`qsync-opt solve` and the simulator do not") from None
    return ray


# --------------------------------------------------------------------------- the model
def build_model(cfg, seed: int):
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


class RolloutActor:
    """Body of the rollout actor (plain class, so it can be tested without Ray)."""

    def __init__(self, idx: int, cfg: dict, cap: int, seed: int):
        import torch

        torch.set_num_threads(1)
        self.torch = torch
        self.idx, self.cfg, self.cap = idx, cfg, cap
        self.model = build_model(cfg, seed).eval()
        h, hd = cfg["heads"], cfg["hidden"] // cfg["heads"]
        shape = (cap, h, cfg["max_ctx"], hd)
        self.K = [torch.zeros(shape) for _ in range(cfg["layers"])]
        self.V = [torch.zeros(shape) for _ in range(cfg["layers"])]
        self.slots: dict[int, dict] = {}  # tid -> {slot, tokens, target}
        self.free = list(range(cap))
        self.version = 0
        self.step_log: list[tuple] = []
        """(batch, ΣL, wall s, busy, CPU s of this thread, start perf_counter, longest context) per decode step"""
        self.prefill_log: list[tuple] = []
        """(sequences, mean tokens, wall s, CPU s, start perf_counter) per admission"""
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
        t0, c0 = time.perf_counter(), time.thread_time()
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
        cpu = time.thread_time() - c0
        dt = time.perf_counter() - t0  # after the CPU-time read: see step()
        if items:
            self.prefill_log.append((len(items), float(np.mean([len(c) for _, c, _ in items])), dt, cpu, t0))
        return dt

    def reset(self, seed: int):
        self.model = build_model(self.cfg, seed).eval()
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
                t0, c0 = time.perf_counter(), time.thread_time()
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
                # the CPU-time read is a system call, where a loaded machine switches this process out: read it
                # before the wall clock, or that wait falls between the logged steps (docs/rollout.md)
                cpu = time.thread_time() - c0
                self.step_log.append((len(tids), total, time.perf_counter() - t0, busy, cpu, t0, lmax))
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


class TrainerActor:
    """Body of the trainer actor: a real AdamW step per batch, computed whole (`train`) or micro-batch by micro-batch
    as trajectories finish (`accumulate` for each but the last, then `train`): each call's forward and backward adds
    its summed loss's gradients, and the step divides them by the step's response tokens, so both give the same
    gradient (up to float summation order). The stand-in reward needs nothing from the rest of the batch (`advantage`),
    which is what lets a micro-batch be computed before the batch is in."""

    def __init__(self, cfg: dict, seed: int, lr: float = 1e-4, reward_ref: float = 64.0):
        import torch

        torch.set_num_threads(1)
        self.torch = torch
        self.cfg, self.lr, self.reward_ref = cfg, lr, float(reward_ref)
        self.model = build_model(cfg, seed)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.log: list[tuple] = []
        """(tokens, wall s, CPU s, start perf_counter, publish s, ends the step) per call"""
        self.version = 0
        self.acc_tokens, self.acc_loss = 0.0, 0.0

    def reset(self, seed: int):
        self.__init__(self.cfg, seed, self.lr, self.reward_ref)
        return True

    def weights(self):
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def advantage(self, lengths):
        """A stand-in reward per trajectory (random weights have no task to reward): the log of its response length
        over `reward_ref` (the workload's mean response), so long and short responses pull opposite ways. Per
        trajectory, unlike GRPO's group-normalised advantage, which would need micro-batches of whole groups."""
        torch = self.torch
        return torch.log(torch.as_tensor(lengths, dtype=torch.float).clamp(min=1.0) / self.reward_ref)

    def _backward(self, seqs, prompt_lens) -> int:
        """Forward and backward of `seqs`, the policy-gradient loss summed over their response tokens (the step
        normalises); gradients add up in the parameters' .grad. Returns the padded tokens computed."""
        torch = self.torch
        n = max(len(s) for s in seqs)
        toks = torch.zeros(len(seqs), n, dtype=torch.long)
        mask = torch.zeros(len(seqs), n)
        for i, (s, p) in enumerate(zip(seqs, prompt_lens)):
            toks[i, :len(s)] = torch.tensor(s)
            mask[i, p:len(s)] = 1.0
        adv = self.advantage([len(s) - p for s, p in zip(seqs, prompt_lens)])
        logits = self.model(toks[:, :-1])
        logp = torch.log_softmax(logits, -1).gather(-1, toks[:, 1:, None])[..., 0]
        loss = -(adv[:, None] * logp * mask[:, 1:]).sum()
        loss.backward()
        self.acc_tokens += float(mask[:, 1:].sum())
        self.acc_loss += float(loss.detach())
        return len(seqs) * n

    def _apply(self) -> float:
        """The optimizer step on the gradients accumulated since the last: divided by the step's response tokens
        (the mean over every token of the batch); returns the step's mean loss."""
        scale = 1.0 / max(self.acc_tokens, 1.0)
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        loss = self.acc_loss * scale
        self.acc_tokens, self.acc_loss = 0.0, 0.0
        self.version += 1
        return loss

    def accumulate(self, seqs, prompt_lens):
        """A micro-batch that does not end its step: forward and backward only. Returns [CPU s, start, wall s]."""
        t0, c0 = time.perf_counter(), time.thread_time()
        tokens = self._backward(seqs, prompt_lens)
        cpu = time.thread_time() - c0
        dt = time.perf_counter() - t0  # after the CPU-time read: see RolloutActor.step
        self.log.append((tokens, dt, cpu, t0, 0.0, False))
        return [cpu, t0, dt]

    def train(self, seqs, prompt_lens):
        """The step's last micro-batch (or its whole batch), then the optimizer step; returns [version, ref, loss,
        CPU s, start, wall s, publish s] (ref: the new weights in the object store, published once: the relay;
        publish s: the optimizer step and the publishing, which only a step's last call pays)."""
        import ray

        t0, c0 = time.perf_counter(), time.thread_time()
        tokens = self._backward(seqs, prompt_lens)
        t1 = time.perf_counter()
        loss = self._apply()
        ref = ray.put(self.weights())
        cpu = time.thread_time() - c0
        t2 = time.perf_counter()  # after the CPU-time read: see RolloutActor.step
        self.log.append((tokens, t2 - t0, cpu, t0, t2 - t1, True))
        return [self.version, ref, loss, cpu, t0, t2 - t0, t2 - t1]

    def logs(self):
        return self.log


def model_dict(job) -> dict:
    m = job.rollout.model
    w = job.rollout.workload
    return {"hidden": m.get("hidden"), "heads": m.get("heads"), "layers": m.get("layers"), "ffn": m.get("ffn"),
            "vocab": m.get("vocab"), "max_ctx": w.max_prompt() + w.max_len + 1}
