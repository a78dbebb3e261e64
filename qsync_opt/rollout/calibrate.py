"""Calibration of the simulator's costs to a real run's timings (decode, prefill, trainer, weight loads).

`calibrate` fits, from rollout.ray_run.run's logs, a decode-step model per number of actors decoding
at once (they share the host's cores), the per-call overhead, a prefill and a trainer-step model and
the broadcast and pull times; `CalibratedCosts` gives them the interface the simulator uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
