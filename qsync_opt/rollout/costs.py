"""Rollout costs from the shared LLM cost model, `qsync_opt.llm.costs` (the one serving prices with).

Per rollout worker (device, weight bit-width):

* decode step t(B, ΣL): the LLM cost model's decode-layer time for a micro-batch of B sequences
  at mean past length ΣL/B (its KV reads are linear in B·ctx = ΣL, so this is exact for them),
  times the layers, plus the LM head;
* prefill of m prompts of L tokens: its prefill-layer time at micro-batch m;
* KV bytes per token (FP16, every layer) and the KV room left after the weights at the
  bit-width, runtime overhead and one prefill's activations;
* weight sync: a global broadcast of the bf16 weights over the cluster interconnect (every rollout
  and the trainer take part) or a relay pull: the trainer pushes once to a master relay and
  resumes; each rollout pulls its bit-width's copy from its node's relay over `relay_link`;
* migration of a trajectory with context c: re-prefill of c tokens on the destination, or a KV
  transfer of c·kv_bytes_per_token over the interconnect, whichever is cheaper.

The trainer step (bf16 forward + backward) is 6·params·tokens over the trainer group's achieved
bf16 rate unless the spec gives a measured `trainer_step_s`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from qsync_opt.llm import costs as llm
from qsync_opt.llm.config import TransformerConfig

LINE_SPAN = 4096.0
"""Tokens between the two points that fix each line of t(ΣL) at fixed B."""


def model_params(cfg: TransformerConfig) -> float:
    """Parameters of the whole model (layers' linears + embeddings / LM head)."""
    emb = llm.embedding_bytes(cfg) / 2
    return cfg.get("layers") * sum(llm.linear_params(cfg)) + emb


def model_bytes(cfg: TransformerConfig, bits: int) -> float:
    """Weights of the whole model at `bits` (embeddings and head stay FP16)."""
    return cfg.get("layers") * llm.weight_bytes(cfg, bits) + llm.embedding_bytes(cfg)


@dataclass(frozen=True)
class WorkerCosts:
    """Costs of one rollout worker kind: `group` devices of `device` at `bits`."""

    group: str
    device: str
    bits: int
    count: int
    kv_bytes_per_token: float
    kv_capacity_tokens: float
    weight_bytes: float
    pull_s: float
    """Seconds to pull this bit-width's weights from the node's relay."""
    _cfg: TransformerConfig = field(repr=False, compare=False)
    _dev: object = field(repr=False, compare=False)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    def decode_lines(self, batch: int) -> tuple[float, float, float, float]:
        """(a1, b1, a2, b2), ms: one decode step of `batch` sequences whose contexts sum to S tokens is
        max(a1 + b1·S, a2 + b2·S) (`decode_lines`)."""
        c = self._memo.get(batch)
        if c is None:
            c = self._memo[batch] = decode_lines(self._cfg, self._dev, self.bits, int(batch))
        return c

    def decode_ms(self, batch: int, total_ctx: float) -> float:
        """One decode step of `batch` sequences whose contexts sum to `total_ctx` tokens."""
        if batch <= 0:
            return 0.0
        c = self.decode_lines(batch)
        s = max(total_ctx, batch)
        return max(c[0] + c[1] * s, c[2] + c[3] * s)

    def decode_ms_direct(self, batch: int, total_ctx: float) -> float:
        """decode_ms straight from the LLM cost model (no line fit): what tests compare against."""
        return _decode_ms(self._cfg, self._dev, self.bits, int(batch), max(total_ctx, batch))

    def prefill_ms(self, m: int, tokens: float) -> float:
        """Prefill of m sequences of `tokens` tokens each (one micro-batch)."""
        if m <= 0 or tokens <= 0:
            return 0.0
        key = ("p", int(m), int(math.ceil(tokens)))
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = _prefill_ms(self._cfg, self._dev, self.bits, *key[1:])
        return t

    def prefill_set_ms(self, lengths) -> float:
        """Prefill of sequences of unequal lengths in one micro-batch (a re-prefill of interrupted trajectories):
        attention is priced at Σ L², not at m · mean², which undercounts a long-tailed batch."""
        ls = [int(math.ceil(x)) for x in lengths if x > 0]
        if not ls:
            return 0.0
        m, tok, sq = len(ls), sum(ls), sum(x * x for x in ls)
        w = llm.Workload(prompt_len=tok / m, gen_tokens=0, global_batch=m)  # the head reads Σ L hidden states
        return (self._cfg.get("layers") * llm.prefill_layer_ms_lengths(self._cfg, self._dev, self.bits, tok, sq)
                + llm.head_ms(self._cfg, w, self._dev, m, "prefill"))

    def full_rate(self, batch: int, mean_ctx: float) -> float:
        """Tokens/s at a steady batch of `batch` sequences of mean context `mean_ctx`."""
        return batch / (self.decode_ms(batch, batch * mean_ctx) / 1e3)


def _decode_ms(cfg, dev, bits: int, batch: int, total_ctx: float) -> float:
    w = llm.Workload(prompt_len=total_ctx / batch, gen_tokens=0, global_batch=batch)
    layer = llm.decode_layer_ms(cfg, w, dev, bits, batch)
    return cfg.get("layers") * layer + llm.head_ms(cfg, w, dev, batch, "decode")


def decode_lines(cfg, dev, bits: int, batch: int) -> tuple[float, float, float, float]:
    """The LLM cost model's decode step at fixed B as max of two lines in ΣL, read off four points.

    Its kernel time is max(FLOPs / rate, bytes / bandwidth) + constants, and at fixed B both FLOPs
    and bytes are affine in ΣL (B · mean context), so t(ΣL) is exactly the larger of a line through
    two short-context points and one through two long-context points
    (tests/rollout/test_costs.py checks it against direct calls)."""
    lo, lo2 = batch * 1.0, batch * 1.0 + LINE_SPAN
    hi2, hi = batch * 1.0e6, batch * 1.0e6 - LINE_SPAN
    t1, t2 = _decode_ms(cfg, dev, bits, batch, lo), _decode_ms(cfg, dev, bits, batch, lo2)
    t3, t4 = _decode_ms(cfg, dev, bits, batch, hi), _decode_ms(cfg, dev, bits, batch, hi2)
    b1 = (t2 - t1) / (lo2 - lo)
    b2 = (t4 - t3) / (hi2 - hi)
    return t1 - b1 * lo, b1, t3 - b2 * hi, b2


def _prefill_ms(cfg, dev, bits: int, m: int, tokens: int) -> float:
    w = llm.Workload(prompt_len=tokens, gen_tokens=0, global_batch=m)
    return cfg.get("layers") * llm.prefill_layer_ms(cfg, w, dev, bits, m) + llm.head_ms(cfg, w, dev, m, "prefill")


def worker_costs(job, wg) -> WorkerCosts:
    """Costs of worker group `wg` (a rollout.workers entry) of `job`."""
    r = job.rollout
    g = next(g for g in job.cluster.groups if g.name == wg.group)
    dev = g.device_spec
    cfg = r.model
    kvt = cfg.get("layers") * llm.kv_bytes(cfg, llm.Workload(1, 0, 1))
    wbytes = model_bytes(cfg, wg.bits)
    act = llm.activation_peak_bytes(cfg, llm.Workload(r.workload.max_prompt(), 0, 1), 1)
    room = llm.capacity_bytes(dev, r.memory_fraction, r.runtime_overhead_gb) - wbytes - act
    link = r.relay
    pull = link.latency_us * 1e-6 + wbytes / (link.bandwidth_gbs * 1e9)
    return WorkerCosts(g.name, dev.name, int(wg.bits), g.count, kvt, room / kvt, wbytes, pull, cfg, dev)


@dataclass(frozen=True)
class SyncCosts:
    broadcast_s: float
    """Global broadcast of bf16 weights to every rollout: trainer and all rollouts stall."""
    push_s: float
    """Trainer's stall with relays: one push of bf16 weights to the master relay."""
    relay_fanout_s: float
    """Master relay to every node's relay (in the background)."""
    kv_link_gbs: float
    kv_link_latency_s: float


def sync_costs(job) -> SyncCosts:
    r = job.rollout
    link = job.cluster.link
    n = sum(wc.count for wc in (worker_costs(job, w) for w in r.workers))
    bf16 = model_bytes(r.model, 16)
    lat = link.latency_us * 1e-6
    bw = link.bandwidth_gbs * 1e9
    # pipelined tree broadcast: the bytes once over the slowest link plus a latency per tree level
    bcast = bf16 / bw + lat * math.ceil(math.log2(n + 1))
    push = bf16 / bw + lat
    return SyncCosts(bcast, push, bcast, link.bandwidth_gbs, lat)


def migration_s(ctx: float, dst: WorkerCosts, sync: SyncCosts) -> tuple[float, str]:
    """(seconds, 'reprefill' | 'kv') to move a trajectory of `ctx` tokens onto `dst`: the cheaper way."""
    reprefill = dst.prefill_ms(1, ctx) / 1e3
    kv = sync.kv_link_latency_s + ctx * dst.kv_bytes_per_token / (sync.kv_link_gbs * 1e9)
    return (reprefill, "reprefill") if reprefill <= kv else (kv, "kv")


def trainer_step_s(job, tokens: float) -> float:
    """Seconds for one trainer step over `tokens` tokens (prompt + response)."""
    r = job.rollout
    if r.trainer_step_s is not None:
        return r.trainer_step_s
    g = next(g for g in job.cluster.groups if g.name == r.trainer)
    dev = g.device_spec
    prec = "bf16" if dev.supports("bf16") else ("fp16" if dev.supports("fp16") else "fp32")
    return 6 * model_params(r.model) * tokens / (g.count * dev.achieved_flops(prec))


def micro_batch_bounds(batch: int, micro_batches: int, j: int) -> tuple[int, int]:
    """[lo, hi): the trajectories of a step's j-th micro-batch (0-based) when a batch is split into `micro_batches`
    nearly equal ones in the order the trainer takes them (the first batch % micro_batches hold one more)."""
    size, extra = divmod(batch, micro_batches)
    lo = j * size + min(j, extra)
    return lo, lo + size + (j < extra)


def micro_batch_seconds(train_s, tokens: float, micro_batches: int = 1, last: bool = True,
                        per_step_s: float | None = None, **kw) -> float:
    """Seconds the trainer computes one micro-batch of `tokens` (the whole step when `micro_batches` is 1): its
    forward and backward at `train_s`'s price per token, and, when `last`, the optimizer step and the weights'
    publishing, which a calibration measures apart (`train_s.publish`, charged to the step's last micro-batch only).
    A step given as measured seconds (`per_step_s`, rollout.trainer_step_s) is split evenly: 1/micro_batches each."""
    if per_step_s is not None:
        return per_step_s / micro_batches
    s = train_s(tokens, **kw)
    publish = getattr(train_s, "publish", 0.0)
    return s if last or not publish else max(1e-3, s - publish)


def all_worker_costs(job) -> list[WorkerCosts]:
    return [worker_costs(job, w) for w in job.rollout.workers]
