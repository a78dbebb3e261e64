"""Serving spec + device order + micro-batch sizes -> ServingInstance (the planner's plain data)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from qsync_opt.hardware.device import DeviceSpec
from qsync_opt.llm import costs as C
from qsync_opt.serving.spec import ServingSpec
from qsync_opt.serving.program import ServingInstance, StageData
COST_SOURCE = (
    "roofline from the device catalog: prefill at the FP16 tensor rate, decode at memory bandwidth "
    "(weights at their bit-width + KV reads at the mean context), weight-only dequantisation on the CUDA cores"
)


@dataclass(frozen=True)
class PipelineDevice:
    group: str
    index: int
    device: DeviceSpec

    @property
    def name(self) -> str:
        return f"{self.group}[{self.index}]"


def workload(s: ServingSpec) -> C.Workload:
    return C.Workload(s.prompt_len, s.gen_tokens, s.global_batch)


def micro_batch_sizes(s: ServingSpec, phase: str) -> list[int]:
    given = getattr(s.micro_batches, phase)
    if given != "auto":
        return sorted(set(given))
    b = s.global_batch
    return sorted({2**k for k in range(int(math.log2(b)) + 1) if b % 2**k == 0} | {b})


def position(j: int, stages: int) -> str:
    """A pipeline stage's position as the measured stage fit names it: 'only', 'first', 'last' or 'mid'."""
    if stages == 1:
        return "only"
    return "first" if j == 0 else "last" if j == stages - 1 else "mid"


def stage_messages_ms(stages: int, hops: Mapping[tuple[str, int], float], prefill_mb: int,
                      decode_mb: int) -> dict[tuple[str, int], float]:
    """(phase, stage) -> the measured hops a stage's own thread handles per micro-batch on a local pipeline, ms:
    each hop costs its sender and its receiver (StageData.msg_*_ms). Prefill: stage 0 sends its activations, the
    last stage receives them and sends the first tokens back, a middle stage receives and sends; decode: every
    stage receives one message and sends one (stage 0 gets the tokens back, the last sends them). One stage: none."""
    if stages == 1:
        return {("prefill", 0): 0.0, ("decode", 0): 0.0}
    pre, dec = hops[("prefill", prefill_mb)], hops[("decode", decode_mb)]
    out = {}
    for j in range(stages):
        out[("prefill", j)] = pre if j == 0 else pre + (dec if j == stages - 1 else pre)
        out[("decode", j)] = 2 * dec
    return out


def build(s: ServingSpec, order: list[PipelineDevice], prefill_mb: int, decode_mb: int,
          omega: list[dict[int, float]], link: tuple[float, float], max_indicator: float | None,
          measured: Mapping | None = None, hops: Mapping[tuple[str, int], float] | None = None,
          serial: bool = False) -> ServingInstance:
    """Costs of every layer on every pipeline position for these micro-batch sizes.

    `measured`: group name -> measured costs (`serving.profile.GroupCosts`: `prefill[(bits, m)]`,
    `decode[(bits, m)]`, ms per layer, and the stage call's fixed time at the stage's position
    `fixed[(position, phase, m)]`, else `head[(phase, m)]` on stage 0) replacing the roofline's layer and
    head times on that group's devices; memory stays modelled. `hops`: (phase, micro-batch) -> one measured stage-to-stage hop, ms
    (serving/link.py), replacing the interconnect's α + β·bytes."""
    cfg, w = s.model, workload(s)
    bw, lat_us = link
    msg = stage_messages_ms(len(order), hops, prefill_mb, decode_mb) if hops else None
    stages = []
    for j, pd in enumerate(order):
        dev = pd.device
        act = C.activation_peak_bytes(cfg, w, prefill_mb)
        head = j == 0
        mc = (measured or {}).get(pd.group)
        if mc is None:
            pre = {b: C.prefill_layer_ms(cfg, w, dev, b, prefill_mb) for b in s.bits}
            dec = {b: C.decode_layer_ms(cfg, w, dev, b, decode_mb) for b in s.bits}
            fpre = C.head_ms(cfg, w, dev, prefill_mb, "prefill") if head else 0.0
            fdec = C.head_ms(cfg, w, dev, decode_mb, "decode") if head else 0.0
        else:
            pre = {b: mc.prefill[(b, prefill_mb)] for b in s.bits}
            dec = {b: mc.decode[(b, decode_mb)] for b in s.bits}
            if mc.fixed is not None:  # the stage call as it runs at this position (profile.fit_stage)
                where = position(j, len(order))
                fpre, fdec = mc.fixed[(where, "prefill", prefill_mb)], mc.fixed[(where, "decode", decode_mb)]
            else:
                fpre = mc.head[("prefill", prefill_mb)] if head else 0.0
                fdec = mc.head[("decode", decode_mb)] if head else 0.0
        stages.append(StageData(
            name=pd.name,
            device=dev.name,
            pre_ms=pre,
            dec_ms=dec,
            mem_bytes={b: C.layer_bytes(cfg, w, b) for b in s.bits},
            fixed_pre_ms=fpre,
            fixed_dec_ms=fdec,
            fixed_mem_bytes=act + (C.embedding_bytes(cfg) + prefill_mb * cfg.get("vocab") * 4 if head else 0.0),
            capacity_bytes=C.capacity_bytes(dev, s.memory_fraction, s.runtime_overhead_gb),
            msg_pre_ms=msg[("prefill", j)] if msg else 0.0,
            msg_dec_ms=msg[("decode", j)] if msg else 0.0,
            cost_source="roofline" if mc is None else "measured",
        ))
    return ServingInstance(
        stages=tuple(stages),
        bits=tuple(s.bits),
        omega=tuple(omega),
        m_pre=s.global_batch // prefill_mb,
        m_dec=s.global_batch // decode_mb,
        decode_rounds=s.gen_tokens - 1,
        comm_pre_ms=hops[("prefill", prefill_mb)] if hops else C.transfer_ms(cfg, w, prefill_mb, "prefill", bw, lat_us),
        comm_dec_ms=hops[("decode", decode_mb)] if hops else C.transfer_ms(cfg, w, decode_mb, "decode", bw, lat_us),
        max_indicator=max_indicator,
        theta=s.quality.theta,
        serial=serial,
        meta={"prefill_mb": prefill_mb, "decode_mb": decode_mb, "order": [pd.name for pd in order]},
    )
