"""The serving cost model against numbers worked by hand, and each baseline against what its docstring
promises, checked by enumeration (not by its name)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from serving_cases import random_instance

from qsync_opt.hardware.device import DeviceSpec
from qsync_opt.llm import costs as C
from qsync_opt.llm.config import TransformerConfig
from qsync_opt.serving.program import Assignment, ServingInstance, StageData, evaluate
from qsync_opt.serving.baselines import adabits, even_sizes, pipeedge, uniform
from qsync_opt.serving.bounds import brute_force

# A device with round numbers: 50 TFLOP/s achieved FP16, 10 TFLOP/s FP32 (CUDA cores), 800 GB/s achieved,
# 12 launches × 5 µs = 0.06 ms per layer and step.
DEV = DeviceSpec(name="hand", memory_gb=16, bandwidth_gbs=1000, peak_tflops={"fp32": 20, "fp16": 100},
                 efficiency={"fp32": 0.5, "fp16": 0.5}, bandwidth_efficiency=0.8, launch_overhead_us=5)
# h = 1024, f = 4096, 16 heads of 64 (kv = 1024), plain MLP: n = 4h² + 2hf = 12,582,912 weights per layer.
CFG = TransformerConfig(layers=4, hidden=1024, ffn=4096, heads=16, vocab=32000, max_positions=512)
W = C.Workload(prompt_len=128, gen_tokens=16, global_batch=8)


def test_prefill_layer_time_by_hand():
    # mb = 4 prompts of s = 128: FLOPs 2·mb·s·n + 4·mb·s²·h = 12,884,901,888 + 268,435,456 = 13,153,337,344
    # -> 0.26306674688 ms at 50 TFLOP/s. Bytes at 16 bits: weights 2n + 6h·2 = 25,178,112, activations
    # mb·s·(8h + 2f)·2 + 2·mb·s·kv·2 = 18,874,368: 44,052,480 B = 0.0550656 ms at 800 GB/s, so compute-bound.
    assert C.prefill_layer_ms(CFG, W, DEV, 16, 4) == pytest.approx(0.26306674688 + 0.06, rel=1e-12)
    # 4 bits: the same FLOPs; weights n/2 + n/128·2 + 12,288 = 6,500,352 B, plus the FP16 copy written and read
    # (4n = 50,331,648 B): 75,706,368 B = 0.09463296 ms, still under compute; dequantising n weights at
    # 4 ops each on 10 TFLOP/s adds 0.0050331648 ms.
    assert C.prefill_layer_ms(CFG, W, DEV, 4, 4) == pytest.approx(0.26306674688 + 0.0050331648 + 0.06, rel=1e-12)


def test_decode_layer_time_by_hand():
    # one step of mb = 4 at the mean past length 128 + 16/2 = 136: FLOPs 2·mb·n + 4·mb·136·h = 102,891,520
    # (0.0020578304 ms). Bytes at 16 bits: weights 25,178,112 + KV read 2·mb·136·kv·2 = 2,228,224 + activations
    # mb·(8h + 2f)·2 = 131,072: 27,537,408 B = 0.03442176 ms: memory-bound.
    assert C.decode_layer_ms(CFG, W, DEV, 16, 4) == pytest.approx(0.03442176 + 0.06, rel=1e-12)
    # 4 bits: 6,500,352 + 2,228,224 + 131,072 = 8,859,648 B = 0.01107456 ms, plus 0.0050331648 ms dequantising
    assert C.decode_layer_ms(CFG, W, DEV, 4, 4) == pytest.approx(0.01107456 + 0.0050331648 + 0.06, rel=1e-12)


def _schedule_prefill(stage_ms, hop_ms, micro_batches, back_ms):
    """Micro-batches through the stages in order, each stage one at a time: when the last one is done and
    its last token is back at the first stage (which holds the LM head)."""
    free, t = [0.0] * len(stage_ms), 0.0
    for _ in range(micro_batches):
        t = 0.0
        for j, p in enumerate(stage_ms):
            t = max(t + (hop_ms if j else 0.0), free[j]) + p
            free[j] = t
    return t + (back_ms if len(stage_ms) > 1 else 0.0)


def _schedule_decode(stage_ms, hop_ms, micro_batches, rounds):
    """Each round every micro-batch's token goes round the ring (stage 0 again for the next token)."""
    free, back = [0.0] * len(stage_ms), [0.0] * micro_batches
    for _ in range(rounds):
        for i in range(micro_batches):
            t = back[i]
            for j, d in enumerate(stage_ms):
                t = max(t + (hop_ms if j else 0.0), free[j]) + d
                free[j] = t
            back[i] = t + (hop_ms if len(stage_ms) > 1 else 0.0)
    return max(back)


def _pipeline(pre, dec, m_pre, m_dec, rounds, hop_pre, hop_dec):
    st = tuple(StageData(name=f"s{j}", device="x", pre_ms={16: p}, dec_ms={16: d}, mem_bytes={16: 0.0})
               for j, (p, d) in enumerate(zip(pre, dec)))
    inst = ServingInstance(stages=st, bits=(16,), omega=tuple({16: 0.0} for _ in pre), m_pre=m_pre, m_dec=m_dec,
                           decode_rounds=rounds, comm_pre_ms=hop_pre, comm_dec_ms=hop_dec)
    return evaluate(inst, Assignment((1,) * len(pre), (16,) * len(pre)))


@pytest.mark.parametrize("pre, dec, m_pre, m_dec", [
    ([2.5, 3.0], [0.4, 0.3], 4, 1), ([2.5, 3.0], [0.4, 0.3], 4, 4), ([1.0, 1.0, 1.0], [0.5, 0.5, 0.5], 2, 8),
    ([1.0, 2.0], [0.5, 1.0], 1, 2), ([3.0], [0.7], 3, 2)])
def test_pipeline_latencies_match_a_schedule_worked_step_by_step(pre, dec, m_pre, m_dec):
    hop_pre, hop_dec, rounds = 0.2, 0.05, 5
    ev = _pipeline(pre, dec, m_pre, m_dec, rounds, hop_pre, hop_dec)
    # e.g. the first case: 2.5 + 0.2 + 3.0 for the first micro-batch, 3 more at the slower stage's 3.0 ms, and
    # 0.05 ms back to the head: 14.75 ms
    assert ev.prefill_ms == pytest.approx(_schedule_prefill(pre, hop_pre, m_pre, hop_dec), rel=1e-12)
    sched = _schedule_decode(dec, hop_dec, m_dec, rounds)
    ring = sum(dec) + (len(dec) * hop_dec if len(dec) > 1 else 0.0)
    if m_dec == 1:  # one token in flight: every round is one trip round the ring
        assert ev.decode_ms == pytest.approx(sched, rel=1e-12)
    else:  # steady state (rounds × the slower of ring and micro-batches × bottleneck); the schedule adds
        # at most one filling of the ring, which the model leaves out
        assert ev.decode_ms == pytest.approx(rounds * max(m_dec * max(dec), ring), rel=1e-12)
        assert ev.decode_ms <= sched + 1e-9 and sched - ev.decode_ms <= ring + 1e-9


def test_first_worked_case_in_numbers():
    ev = _pipeline([2.5, 3.0], [0.4, 0.3], 4, 1, 5, 0.2, 0.05)
    assert ev.prefill_ms == pytest.approx(14.75) and ev.decode_ms == pytest.approx(5 * (0.4 + 0.3 + 2 * 0.05))


SEEDS = [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("seed", SEEDS)
def test_uniform_is_the_even_split_at_the_highest_bit_that_fits(seed):
    inst = replace(random_instance(400 + seed, layers=5, stages=3), max_indicator=None, theta=0.0)
    sizes = even_sizes(inst.layers, len(inst.stages))
    fits = [b for b in inst.bits if not evaluate(inst, Assignment(sizes, (b,) * inst.layers)).violations]
    a = uniform(inst)
    if not fits:
        assert a is None
        return
    assert a == Assignment(sizes, (max(fits),) * inst.layers)
    assert sizes == tuple(sorted(sizes, reverse=True)) and max(sizes) - min(sizes) <= 1  # earlier stages: the remainder


@pytest.mark.parametrize("seed", SEEDS)
def test_pipeedge_is_one_bit_width_with_the_fastest_partition(seed):
    inst = replace(random_instance(500 + seed, layers=5, stages=3), max_indicator=None, theta=0.0)
    by_bit = {b: brute_force(replace(inst, allowed_bits=(b,))) for b in inst.bits}
    fitting = [b for b, (best, _) in by_bit.items() if best is not None]
    a = pipeedge(inst)
    if not fitting:
        assert a is None
        return
    b = max(fitting)  # the highest bit-width for which any partition fits
    assert set(a.bits) == {b}
    assert evaluate(inst, a).objective == pytest.approx(by_bit[b][1], rel=1e-6)  # the exact best partition


@pytest.mark.parametrize("seed", SEEDS)
def test_adabits_is_the_even_split_with_least_quality_loss_then_fastest(seed):
    inst = replace(random_instance(600 + seed, layers=5, stages=3), max_indicator=None, theta=0.0)
    sizes = even_sizes(inst.layers, len(inst.stages))
    plans = [Assignment(sizes, bits) for bits in itertools.product(inst.bits, repeat=inst.layers)]
    ok = [(evaluate(inst, p).quality, evaluate(inst, p).objective) for p in plans if not evaluate(inst, p).violations]
    a = adabits(inst)
    if not ok:
        assert a is None
        return
    q_min = min(q for q, _ in ok)
    t_min = min(t for q, t in ok if q <= q_min * (1 + 1e-9) + 1e-12)
    ev = evaluate(inst, a)
    assert a.sizes == sizes and not ev.violations
    assert ev.quality == pytest.approx(q_min, rel=1e-9, abs=1e-12)
    assert ev.objective == pytest.approx(t_min, rel=1e-4)  # the second solve stops within rel_gap 1e-4
