"""`qsync-opt run SERVING_SPEC` states measured against predicted tokens/s as a fact (serve.prediction_check):
serve.json carries the ratio and whether it is within the tolerance, report.md says plainly when the plan's
choice is not confirmed. Driven by scripted stage records (a known span), never by this machine's timing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from qsync_opt.serving import serve
from qsync_opt.serving.planner import plan_serving
from qsync_opt.serving.spec import load_serving_spec
from qsync_opt.solver.budget import Budget

MODEL = {"layers": 2, "hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "vocab": 256, "max_positions": 64,
         "ffn_matrices": 3, "tied_embeddings": False}
JOB = load_serving_spec({
    "kind": "serving", "name": "check", "cluster": {"groups": [{"name": "cpu", "device": "cpu-local"}],
                                                     "interconnect": "loopback"},
    "serving": {"model": MODEL, "prompt_len": 8, "gen_tokens": 4, "global_batch": 2, "bits": [16], "costs": "roofline",
                "micro_batches": {"prefill": [2], "decode": [2]}, "runtime_overhead_gb": 0.1,
                "quality": {"max_indicator": None}},
    "solver": {"time_limit_s": 30}})


def served(span_s: float, gen: int = 4, n: int = 2) -> dict:
    """One stage's records of one batch served in exactly `span_s` seconds: prefill the first half, decode the rest,
each decode call waiting the first quarter of its step for its input."""
    half = span_s / 2
    step = half / (gen - 1)  # each decode call waits a quarter of its step for its input, then computes
    events = [("prefill", 0, 0, 0.0, half, 0, 0.0)] + [
        ("decode", k, 0, half + (k - 0.75) * step, half + k * step, 0, half + (k - 1) * step) for k in range(1, gen)]
    stage = {"rank": 0, "layers": [0, 2], "bits": [16, 16], "events": events, "weight_bytes": 1 << 20,
             "kv_bytes": 1 << 10, "peak_bytes": 1 << 26, "peak_kind": "process max RSS", "threads": 1}
    times = [(0, 0, 0, n, half)] + [(0, k, 0, n, half + k * half / (gen - 1)) for k in range(1, gen)]
    return {"stages": [stage], "tokens": SimpleNamespace(shape=(n, gen)), "token_times": times, "wall_s": span_s}


@pytest.mark.parametrize("factor, confirmed, words", [
    (0.70, False, "measured 0.70x the prediction (more than 15% below it)"),
    (1.40, False, "measured 1.40x the prediction (more than 15% above it)"),
    (0.90, True, "measured 0.90x the prediction (within 15%)"),
])
def test_run_states_measured_over_predicted_and_whether_it_confirms_the_plan(factor, confirmed, words):
    plan = plan_serving(JOB, Budget(30))
    pred = plan.prediction.tokens_per_s
    span = 2 * 4 / (factor * pred)  # 8 tokens in the span that gives factor x pred
    m = serve.measure(JOB, plan, served(span))
    assert m["tokens_per_s"] == pytest.approx(factor * pred, rel=1e-9)
    assert m["measured_over_predicted"] == pytest.approx(factor, rel=1e-9)
    assert m["prediction_confirmed"] is confirmed and m["tolerance"] == serve.PREDICTION_TOLERANCE
    assert m["verdict"].startswith(words)
    st = m["stages"][0]
    assert st["input_wait_s"] == pytest.approx(span / 2 / 4, rel=1e-9)  # a quarter of the decode half
    assert st["bubble_s"] == pytest.approx(span / 2 / 4, rel=1e-9)
    md = serve.report_md(JOB, "plan text", m)
    assert f"| tokens/s | {pred:.1f} | {factor * pred:.1f} ({factor:.2f}x) |" in md
    if confirmed:
        assert "**Confirmed: measured 0.90x" in md and "not confirmed" not in md
    else:
        assert f"**Not confirmed: {words}" in md and "the plan's choice is not confirmed by this run" in md


def test_the_tolerance_is_a_bound_on_the_ratio_either_side():
    assert serve.prediction_check(100.0, 115.0)["prediction_confirmed"]
    assert serve.prediction_check(100.0, 85.0)["prediction_confirmed"]
    assert not serve.prediction_check(100.0, 84.0)["prediction_confirmed"]
    assert not serve.prediction_check(100.0, 116.0)["prediction_confirmed"]
    assert serve.prediction_check(100.0, 50.0, tolerance=0.6)["prediction_confirmed"]
