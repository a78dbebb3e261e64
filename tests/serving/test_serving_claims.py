"""What a serving plan prints is what was computed: the quality bound is the reported baseline's."""

from __future__ import annotations

import pytest

import qsync_opt


def llm_pq_case(model: str, devices, **serving) -> dict:
    """One of LLM-PQ's evaluation cases, as benchmarks/serving.py states it."""
    groups = [{"name": d.lower().replace("-", "_"), "device": d, "count": n} for d, n in devices]
    s = {"model": {"preset": model}, "prompt_len": 512, "gen_tokens": 100, "global_batch": 32,
         "bits": [3, 4, 8, 16], "orderable": True, "objective": "throughput"}
    s.update(serving)
    return {"kind": "serving", "name": "case", "cluster": {"groups": groups, "interconnect": "pcie3"}, "serving": s,
            "solver": {"backend": "highs", "time_limit_s": 60, "rel_gap": 1e-4, "threads": 1}}


@pytest.mark.parametrize("devices", [
    [("V100-32GB", 2), ("A100-40GB", 2)],  # the spec's order fits 4 bits only; A100 first fits 8
    [("T4", 3), ("V100-32GB", 1)],
], ids=["opt66b-2v100-2a100", "opt30b-3t4-1v100"])
def test_uniform_quality_bound_is_the_reported_uniform_baseline(devices):
    model = "opt-66b" if devices[0][0] == "V100-32GB" else "opt-30b"
    plan = qsync_opt.solve(llm_pq_case(model, devices))
    uni = next(b for b in plan.baselines if b.name == "uniform")
    assert uni.fits
    assert plan.quality_bound == pytest.approx(uni.prediction.quality, rel=1e-12)
    assert plan.prediction.quality <= plan.quality_bound * (1 + 1e-9)
    bits = {b for st in uni.stages for b in st.bits}
    note = next(n for n in plan.notes if n.startswith("quality: hard bound"))
    assert f"{bits.pop()}-bit everywhere" in note and not bits
    assert f"prefill {uni.prefill_micro_batch} / decode {uni.decode_micro_batch}" in note
    assert " > ".join(st.device for st in uni.stages) in note
