"""Serving specs end to end: plan shape, memory recomputed by hand, quality bound, diagnosis, CLI."""

from __future__ import annotations

import json

import pytest

import qsync_opt
from qsync_opt.cli.commands import main
from qsync_opt.errors import InfeasibleError, SolverError, SpecError
from qsync_opt.hardware.device import find_device
from qsync_opt.serving.instance import build, micro_batch_sizes
from qsync_opt.serving.quality import layer_omegas
from qsync_opt.serving.plan import ServingPlan
from qsync_opt.serving.planner import expand
from qsync_opt.llm.config import PRESETS, TransformerConfig
from qsync_opt.serving.program import solve_serving
from qsync_opt.serving.bounds import brute_force
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.jobs import load_spec

H, F, V, POS = 1024, 4096, 32000, 512


def spec(**serving) -> dict:
    """6 layers of h=1024 on three small devices whose memory makes the bits matter."""
    s = dict(model={"layers": 6, "hidden": H, "ffn": F, "heads": 16, "vocab": V, "max_positions": POS},
             prompt_len=128, gen_tokens=16, global_batch=8, bits=[3, 4, 16], runtime_overhead_gb=0.0)
    s.update(serving)
    return {
        "kind": "serving", "name": "tiny",
        "cluster": {"groups": [{"name": "t4", "device": "T4", "count": 2, "memory_gb": 0.1},
                               {"name": "v100", "device": "V100-16GB", "count": 1, "memory_gb": 0.12}]},
        "serving": s,
    }


def hand_layer_bytes(bits: int, batch: int = 8, ctx: int = 144) -> float:
    """Weights (4h² + 2hf packed, one FP16 scale per 128 below 8 bits, FP16 norms/biases) + KV cache."""
    n = 4 * H * H + 2 * H * F
    scales = n / 128 * 2 if bits < 8 else 0.0
    return n * bits / 8 + scales + 6 * H * 2 + 2 * batch * ctx * H * 2


def test_every_preset_has_its_published_size():
    nominal = {"opt-13b": 12.85e9, "opt-30b": 29.97e9, "opt-66b": 65.7e9, "bloom-176b": 176.2e9, "llama-2-7b": 6.74e9,
               "llama-2-13b": 13.0e9, "llama-2-70b": 68.98e9, "llama-3-8b": 8.03e9, "llama-3-70b": 70.55e9}
    assert set(nominal) == set(PRESETS)
    for name, want in nominal.items():
        c = TransformerConfig(preset=name)
        h, kv = c.get("hidden"), c.get("kv_heads") * c.head_dim
        per_layer = 2 * h * h + 2 * h * kv + c.get("ffn_matrices") * h * c.get("ffn")
        emb = c.get("vocab") * h * (1 if c.get("tied_embeddings") else 2)
        total = c.get("layers") * per_layer + emb
        assert abs(total - want) / want < 0.02, (name, total)


def test_plan_stages_are_contiguous_in_order_and_memory_holds_by_hand():
    plan = qsync_opt.solve(spec())
    assert isinstance(plan, ServingPlan)
    assert [s.device for s in plan.stages] == ["t4[0]", "t4[1]", "v100[0]"]  # not orderable: the spec's order
    start = 0
    for st in plan.stages:
        assert st.layers[0] == start and st.layers[1] > st.layers[0]
        assert len(st.bits) == st.layers[1] - st.layers[0]
        start = st.layers[1]
    assert start == 6
    for st in plan.stages:
        mem_gb = {"t4[0]": 0.1, "t4[1]": 0.1, "v100[0]": 0.12}[st.device]
        capacity = 0.95 * mem_gb * 1e9  # runtime_overhead_gb: 0
        b = plan.prefill_micro_batch
        act = 4 * b * 128 * H * 2 + max(b * 16 * 128 * 128 * 2, b * 128 * F * 2)
        head = (V * H + POS * 0) * 2 + b * V * 4 if st.position == 0 else 0.0  # tied, no learned positions
        used = act + head + sum(hand_layer_bytes(x) for x in st.bits)
        assert used <= capacity * (1 + 1e-9), (st.device, used, capacity)
        assert abs(used / 1e9 - st.memory_gb) < 1e-6


def test_plan_is_the_brute_force_optimum_of_its_candidate():
    s = load_spec(spec())
    ss = s.serving
    omega, _ = layer_omegas(ss.model, list(ss.bits), None)
    plan = qsync_opt.solve(s)
    inst = build(ss, expand(s), plan.prefill_micro_batch, plan.decode_micro_batch, omega, (32.0, 8.0), plan.quality_bound)
    best, best_obj = brute_force(inst)
    assert abs(plan.solver.objective_ms - best_obj) <= 1e-6 * best_obj
    for pb in micro_batch_sizes(ss, "prefill"):
        for db in micro_batch_sizes(ss, "decode"):
            other = build(ss, expand(s), pb, db, omega, (32.0, 8.0), plan.quality_bound)
            res = solve_serving(other, "highs", SolveOptions(rel_gap=1e-9))
            if res.objective is not None:
                assert plan.solver.objective_ms <= res.objective * (1 + 1e-6)


@pytest.mark.parametrize("bound", ["uniform", 2000.0, None])
def test_quality_bound_holds_and_plan_beats_baselines(bound):
    plan = qsync_opt.solve(spec(quality={"max_indicator": bound}))
    if bound is None:
        assert plan.quality_bound is None
    else:
        assert plan.prediction.quality <= plan.quality_bound * (1 + 1e-9)
    if bound == 2000.0:
        assert plan.quality_bound == 2000.0 and plan.prediction.quality > 1003  # binds: a 16-bit mix is slower
    best = plan.best_baseline()
    assert best is not None
    if bound is None or bound == "uniform":  # every baseline meets these, so the plan can only be faster
        assert plan.prediction.tokens_per_s >= best.prediction.tokens_per_s * (1 - 1e-9)
    assert plan.solver.status == "optimal"


def test_orderable_pipeline_may_put_the_big_device_first():
    plan = qsync_opt.solve(spec(orderable=True))
    fixed = qsync_opt.solve(spec())
    assert sorted(s.device for s in plan.stages) == ["t4[0]", "t4[1]", "v100[0]"]
    assert plan.prediction.e2e_ms <= fixed.prediction.e2e_ms * (1 + 1e-9)


def test_model_that_fits_nowhere_is_diagnosed():
    s = spec()
    s["cluster"]["groups"][1]["memory_gb"] = 0.12
    s["cluster"]["groups"][0]["memory_gb"] = 0.05
    with pytest.raises(InfeasibleError) as e:
        qsync_opt.solve(s)
    text = str(e.value)
    assert "t4[0]" in text and "short by" in text


def test_cli_exit_3_names_device_and_shortfall(tmp_path, capsys):
    import yaml

    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump({
        "kind": "serving", "cluster": {"groups": [{"name": "t4", "device": "T4", "count": 1}]},
        "serving": {"model": {"preset": "opt-66b"}, "prompt_len": 512, "gen_tokens": 100, "global_batch": 32},
    }))
    assert main(["solve", str(path)]) == 3
    err = capsys.readouterr().err
    assert "t4[0]" in err and "short by" in err


def test_cli_json_is_the_plan(capsys):
    assert main(["solve", "examples/serving_opt30b_t4_v100.yaml", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    plan = ServingPlan.model_validate(data)
    assert plan.kind == "serving" and plan.solver.status in ("optimal", "feasible")
    assert {b.name for b in plan.baselines} == {"uniform", "pipeedge", "adabits"}


def test_bad_serving_fields_are_named():
    with pytest.raises(SpecError, match="preset"):
        load_spec(spec(model={"preset": "opt-31b"}))
    with pytest.raises(SpecError, match="divide"):
        load_spec(spec(micro_batches={"prefill": [3]}))
    with pytest.raises(SpecError, match="max_positions"):
        load_spec(spec(prompt_len=600))
    with pytest.raises(SpecError, match="model"):
        load_spec({"kind": "training", "cluster": {"groups": [{"name": "a", "device": "T4"}]}, "training": {"global_batch": 8}})


def test_calibration_stats_give_per_layer_indicators(tmp_path):
    import yaml

    layers = [{"linears": [{"range": 0.1 * (i + 1), "x_var_sum": 100.0}, {"range": 0.05, "x_var_sum": 50.0, "ffn": True}]}
              for i in range(6)]
    p = tmp_path / "stats.yaml"
    p.write_text(yaml.safe_dump({"layers": layers}))
    plan = qsync_opt.solve(spec(quality={"stats": str(p), "max_indicator": "uniform"}))
    assert plan.solver.form == "per-layer" and "calibration" in plan.quality_source
    assert plan.prediction.quality <= plan.quality_bound * (1 + 1e-9)
    with pytest.raises(SpecError, match="layers"):
        p.write_text(yaml.safe_dump({"layers": layers[:2]}))
        qsync_opt.solve(spec(quality={"stats": str(p)}))


def test_p100_matches_its_datasheet():
    d = find_device("P100")
    assert (d.memory_gb, d.bandwidth_gbs, d.peak_tflops["fp32"], d.peak_tflops["fp16"]) == (16, 732, 9.3, 18.7)


def test_a_limit_too_small_to_solve_anything_is_unknown_not_infeasible():
    """Below the smallest grant no solve starts; with no plan and no proof the answer names the limit."""
    s = spec(orderable=True)
    s["solver"] = {"time_limit_s": 0.001}
    with pytest.raises(SolverError, match=r"no serving plan found within solver.time_limit_s = 0.001 s and none proven infeasible.*raise solver.time_limit_s"):
        qsync_opt.solve(s)


def test_unreachable_quality_bound_is_diagnosed():
    with pytest.raises(InfeasibleError, match=r"least Σω that fits memory is .*bound 1 "):
        qsync_opt.solve(spec(quality={"max_indicator": 1.0}))


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_plan_file_round_trip(tmp_path, suffix):
    plan = qsync_opt.solve(spec())
    path = plan.save(tmp_path / f"plan{suffix}")
    assert ServingPlan.load(path) == plan


def test_meets_bounds_is_recomputed_from_the_plan_figures():
    plan = qsync_opt.solve(spec())
    assert plan.meets_bounds
    over = plan.stages[0].model_copy(update={"memory_gb": plan.stages[0].capacity_gb * 1.01})
    assert not plan.model_copy(update={"stages": [over, *plan.stages[1:]]}).meets_bounds
    if plan.quality_bound is not None:
        worse = plan.prediction.model_copy(update={"quality": plan.quality_bound * 1.01})
        assert not plan.model_copy(update={"prediction": worse}).meets_bounds
