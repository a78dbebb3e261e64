"""Calibration of the simulator's costs to a real run's timings (decode, prefill, trainer, weight loads).

`calibrate` fits, from rollout.ray_run.run's logs, a decode-step model per number of actors decoding
at once (they share the host's cores), the per-call overhead, a prefill and a trainer-step model and
the broadcast and pull times; `CalibratedCosts` gives them the interface the simulator uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qsync_opt.rollout.costs import SyncCosts
from qsync_opt.rollout.driver import MAX_STEPS_PER_CALL


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
    """share[k − 1]: the (a, b, c) of decode_ms when k processes (actors decoding, the trainer training) compute at
    once on this host's shared cores."""
    call_overhead_ms: float = 0.0
    """What the driver waits per step call beyond the actor's own time (the Ray round trip, the driver's loop)."""
    steps_per_call: int = 16
    """Decode steps per call at most (rollout.driver.MAX_STEPS_PER_CALL): a call also ends at a finish."""
    pre_call_ms: float = 0.0
    """What one admission (a prefill of any number of sequences) costs besides its sequences' line `pre`."""

    def decode_ms(self, batch, total_ctx):
        a, b, c = self.dec
        return max(1e-3, a + b * batch + c * total_ctx)

    def decode_ms_shared(self, batch, total_ctx, busy):
        """decode_ms when `busy` processes compute at once (they share this machine's cores)."""
        if not self.share:
            return self.decode_ms(batch, total_ctx)
        a, b, c = self.share[max(1, min(busy, len(self.share))) - 1]
        return max(1e-3, a + b * batch + c * total_ctx)

    def call_ms(self, steps: int) -> float:
        """The driver's overhead for `steps` decode steps run without a finish: one round trip per call."""
        return self.call_overhead_ms * math.ceil(max(1, steps) / self.steps_per_call)

    def prefill_ms(self, m, tokens):
        """One admission of m sequences of `tokens` each."""
        a, b = self.pre
        return max(1e-3, self.pre_call_ms + m * (a + b * tokens))

    def prefill_set_ms(self, lengths):
        """One admission of sequences of unequal lengths: the measured per-sequence line summed (exact for a line)."""
        a, b = self.pre
        ls = [x for x in lengths if x > 0]
        return max(1e-3, self.pre_call_ms + sum(a + b * x for x in ls)) if ls else 0.0

    def full_rate(self, batch, mean_ctx):
        return batch / ((self.decode_ms(batch, batch * mean_ctx) + self.call_overhead_ms / self.steps_per_call) / 1e3)


@dataclass(frozen=True)
class CalibratedTrain:
    """Trainer step seconds = a + b·tokens + g·(actors decoding beside it) + publish: the trainer shares the host's
    cores with the rollout actors, so its step is slower while they decode (measured, not assumed). `tokens` are the
    padded batch's positions (trajectories × the longest): what the real trainer computes. `publish`: the optimizer
    step and the weights' publishing, timed apart by the trainer; a streaming trainer pays it on a step's last
    micro-batch only (rollout.costs.micro_batch_seconds)."""

    a: float
    b: float
    g: float = 0.0
    padded: bool = True
    publish: float = 0.0

    def __call__(self, tokens, beside: int = 0) -> float:
        return max(1e-3, self.a + self.b * tokens + self.g * beside + self.publish)


def _flat(results: dict) -> list:
    out = []
    for r in results.values():
        out += r if isinstance(r, list) else [r]
    return out


def _beside_mean(t, calls) -> float:
    """Actors with a step call in flight, averaged over a trainer step's wall (t: a train_log entry, issued at
    t[4], t[1] s long; calls: (overhead, steps, issued, returned)): how many decode beside it changes within the
    step, and the simulator re-times its step at each change (processor sharing), so the fit is against the mean.
    An entry without its issue time (older logs): the count at issue."""
    if len(t) < 6:
        return 0.0
    a, b = t[4], t[4] + t[1]
    if b <= a or not calls or len(calls[0]) < 4:
        return float(t[5])
    return sum(max(0.0, min(b, c[3]) - max(a, c[2])) for c in calls) / (b - a)


def calibrate(job, results: dict):
    """(costs, sync, train_s) fitted to the rollouts', trainer's and loads' timings of `results`
    (variant -> RunResult, or variant -> list of RunResult from repeated rounds: every run's timings are pooled)."""
    steps, pre, loads, train, calls, pulls, publish = [], [], [], [], [], [], []
    for r in _flat(results):
        for lg in r.logs["rollout"]:
            steps += [s[:4] for s in lg["step"]]
            pre += [p[:3] for p in lg["prefill"]]
        loads += r.logs["broadcast"]
        pulls += r.logs["pull"]
        # each trainer call less its optimizer step and publishing (timed apart, logs from before: not apart)
        train += [(t[0], t[1] - (t[7] if len(t) > 7 else 0.0), _beside_mean(t, r.logs["calls"]))
                  for t in r.logs["train"]]
        publish += [t[7] for t in r.logs["train"] if len(t) > 8 and t[8]]
        calls += [c[:2] for c in r.logs["calls"]]
    S = np.asarray(steps, dtype=float)
    X = np.c_[np.ones(len(S)), S[:, 0], S[:, 1]]
    dec = np.linalg.lstsq(X, S[:, 2] * 1e3, rcond=None)[0]
    # the actors and the trainer share this machine's cores: one fit per number k of them computing at once
    n_act = job.rollout_devices
    share = []
    for k in range(1, n_act + 2):
        sel = S[:, 3] == k
        if sel.sum() >= 30 and len(set(S[sel, 0])) >= 3:
            share.append(tuple(float(x) for x in np.linalg.lstsq(X[sel], S[sel, 2] * 1e3, rcond=None)[0]))
        else:
            share.append(share[-1] if share else tuple(float(x) for x in dec))
    share = tuple(share)
    dec = share[0]
    # what the driver waits beyond the actor's own time (Ray call, the driver's loop), per call
    C = np.asarray(calls, dtype=float)
    overhead_ms = 1e3 * float(C[:, 0].mean()) if len(C) else 0.0
    P = np.asarray(pre, dtype=float)
    # one admission: a constant, plus a line per sequence in its tokens (dt = c + m·a + b·Σtokens). Fitted per
    # sequence alone (dt / m), an admission's constant would be spread over its sequences, overcharging large
    # admissions and undercharging small ones (docs/rollout.md)
    pc = np.linalg.lstsq(np.c_[np.ones(len(P)), P[:, 0], P[:, 0] * P[:, 1]], P[:, 2] * 1e3, rcond=None)[0]
    if pc[0] < 0 or pc[1] < 0:  # no admission-size spread to separate them: the per-sequence line alone
        pa, pre_call = np.linalg.lstsq(np.c_[np.ones(len(P)), P[:, 1]], P[:, 2] * 1e3 / P[:, 0], rcond=None)[0], 0.0
    else:
        pa, pre_call = pc[1:], float(pc[0])
    T = np.asarray(train, dtype=float)
    if len(set(T[:, 2])) > 1:
        ta = np.linalg.lstsq(np.c_[np.ones(len(T)), T[:, 0], T[:, 2]], T[:, 1], rcond=None)[0]
    else:
        ta = np.r_[np.linalg.lstsq(np.c_[np.ones(len(T)), T[:, 0]], T[:, 1], rcond=None)[0], 0.0]
    # means, not medians: the simulator sums these costs, and a sum's expectation is the count times the mean
    load = float(np.mean(loads)) if loads else 0.0
    pull = float(np.mean(pulls)) if pulls else load
    costs = [CalibratedCosts("rollout", "cpu", 32, n_act, 1e12, 1.0, pull, (float(dec[0]), float(dec[1]), float(dec[2])),
                             (float(pa[0]), float(pa[1])), share, overhead_ms, MAX_STEPS_PER_CALL, pre_call)]
    sync = SyncCosts(broadcast_s=load, push_s=0.0, relay_fanout_s=0.0, kv_link_gbs=1e-9, kv_link_latency_s=1e9)
    publish_s = float(np.mean(publish)) if publish else 0.0
    train_s = CalibratedTrain(float(ta[0]), float(ta[1]), float(ta[2]), publish=publish_s)
    return costs, sync, train_s, {"decode_ms": dec, "share_by_busy": share, "call_overhead_ms": overhead_ms,
                                  "prefill_ms_per_seq": tuple(map(float, pa)), "prefill_ms_per_admission": pre_call,
                                  "train_s": tuple(map(float, ta)), "train_publish_s": publish_s,
                                  "broadcast_s": load, "pull_s": pull,
                                  "samples": {"steps": len(S), "prefills": len(P), "train": len(T), "calls": len(C)}}
