"""The measured stage fit (serving/profile.py `fit_stage`, `group_costs`): from whole stage calls timed at each
pipeline position and depth, a fixed term per position and per-layer terms per bit are recovered, and the planner
prices every stage as its position's fixed term plus its layers (instance.build's `fixed_*_ms`)."""

from __future__ import annotations

import pytest

from qsync_opt.serving import profile as P
from qsync_opt.serving.planner import plan_serving
from qsync_opt.serving.spec import load_serving_spec
from qsync_opt.solver.budget import Budget

MODEL = {"layers": 4, "hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "vocab": 256, "max_positions": 64,
         "ffn_matrices": 3, "tied_embeddings": False}

FIXED = {"first": 0.30, "mid": 0.05, "last": 0.45}
"""Scripted fixed cost of a stage call per position, ms (per micro-batch m: times m)."""
LAYER = {4: 0.9, 16: 0.2}
"""Scripted cost of one layer per bit, ms (per micro-batch m: times m)."""


def job(groups=None):
    groups = groups or [{"name": "a", "device": "cpu-local"}, {"name": "b", "device": "cpu-sse41"}]
    return load_serving_spec({
        "kind": "serving", "name": "fit", "cluster": {"groups": groups, "interconnect": "loopback"},
        "serving": {"model": MODEL, "prompt_len": 8, "gen_tokens": 4, "global_batch": 2, "bits": [4, 16],
                    "micro_batches": {"prefill": [1, 2], "decode": [1, 2]}, "runtime_overhead_gb": 0.1,
                    "costs": "auto", "orderable": False, "quality": {"max_indicator": None, "theta": 0.0}},
        "solver": {"time_limit_s": 30}})


def scripted(j, scale=1.0) -> dict[str, float]:
    """A table's entries for a device whose stage call at position p of n layers at b bits takes
    FIXED[p] + n·LAYER[b] ms, times m, times 2 in prefill, times `scale`: what the profiler would store."""
    s, ctx = j.serving, P.decode_context(j)
    out = {}
    for m in P.sizes(j):
        for ph, length in (("prefill", s.prompt_len), ("decode", ctx)):
            k = scale * m * (2.0 if ph == "prefill" else 1.0)
            for b in s.bits:  # a layer entry is a 1-layer middle stage call at b bits
                out[P.entry_key("layer", ph, m, length, b)] = k * (FIXED["mid"] + LAYER[b])
            out[P.entry_key("head", ph, m, length)] = k * 0.01
            for pos in P.POSITIONS:
                for n in P.STAGE_DEPTHS:
                    out[P.stage_key(pos, n, ph, m, length)] = k * (FIXED[pos] + n * LAYER[16])
    assert set(out) == set(P.wanted(j))
    return out


def test_the_fit_recovers_a_known_fixed_and_per_layer_cost():
    f, a = P.fit_stage({(p, n): FIXED[p] + n * 0.2 for p in FIXED for n in (1, 2, 3)})
    assert a == pytest.approx(0.2, rel=1e-12)
    assert f == pytest.approx(FIXED, rel=1e-12)
    # noisy points: least squares, one slope for all positions; a negative fixed term is clamped at 0
    f, a = P.fit_stage({("first", 1): 1.1, ("first", 2): 2.0, ("last", 1): 0.9, ("last", 2): 2.0})
    assert a == pytest.approx(1.0) and f == pytest.approx({"first": 0.05, "last": 0.0})
    with pytest.raises(ValueError, match="two depths"):
        P.fit_stage({("first", 1): 1.0, ("first", 2): 2.0, ("mid", 1): 1.0})


def test_group_costs_turns_a_table_into_fixed_terms_and_per_layer_costs():
    j = job()
    gc = P.group_costs(j, scripted(j))
    for m in P.sizes(j):
        for ph, k in (("prefill", 2.0 * m), ("decode", 1.0 * m)):
            for pos in P.POSITIONS:
                assert gc.fixed[(pos, ph, m)] == pytest.approx(k * FIXED[pos], rel=1e-9)
            assert gc.fixed[("only", ph, m)] == pytest.approx(k * (FIXED["first"] + FIXED["last"] - FIXED["mid"]))
            per = gc.prefill if ph == "prefill" else gc.decode
            for b in LAYER:  # the layer entry less the middle stage call's fixed cost
                assert per[(b, m)] == pytest.approx(k * LAYER[b], rel=1e-9)


def test_the_measured_fit_feeds_each_stages_fixed_terms():
    """Both groups measured (b 3x slower): the plan's stage 0 costs the first position's fixed term plus its
    layers, the last stage the last position's; the ring's sum holds both."""
    j = job()
    measured = {"a": P.group_costs(j, scripted(j)), "b": P.group_costs(j, scripted(j, scale=3.0))}
    plan = plan_serving(j, Budget(30), measured=measured)
    mp, md = plan.prefill_micro_batch, plan.decode_micro_batch
    assert len(plan.stages) == 2
    for st, pos in zip(plan.stages, ("first", "last")):
        g = measured[st.device.split("[")[0]]
        n16 = sum(1 for b in st.bits if b == 16)
        n4 = len(st.bits) - n16
        assert st.prefill_ms == pytest.approx(g.fixed[(pos, "prefill", mp)] + n16 * g.prefill[(16, mp)]
                                              + n4 * g.prefill[(4, mp)], rel=1e-9)
        assert st.decode_ms == pytest.approx(g.fixed[(pos, "decode", md)] + n16 * g.decode[(16, md)]
                                             + n4 * g.decode[(4, md)], rel=1e-9)
    # 4-bit layers cost 4.5x a 16-bit one here and Σω is unbounded with θ = 0: the fastest plan is all 16-bit
    assert {b for st in plan.stages for b in st.bits} == {16}
