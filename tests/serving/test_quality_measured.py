"""Quality, measured (serving/quality_measured.py): the served model's perplexity, the calibration statistics
behind a calibrated Σω, and the empirical indicator the planner can read instead."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

T = pytest.importorskip("transformers")

import qsync_opt  # noqa: E402
from qsync_opt.cli.commands import main  # noqa: E402
from qsync_opt.errors import SpecError  # noqa: E402
from qsync_opt.jobs import load_spec  # noqa: E402
from qsync_opt.serving import lm  # noqa: E402
from qsync_opt.serving import quality_measured as qm  # noqa: E402
from qsync_opt.serving.quality import layer_omegas  # noqa: E402

LAYERS = 3


def tiny(layers: int = LAYERS, rounded: bool = True):
    torch.manual_seed(0)
    cfg = T.LlamaConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=128, vocab_size=256, max_position_embeddings=128)
    model = T.LlamaForCausalLM(cfg).eval()
    if rounded:  # 16-bit layers store bf16 weights: the model rounded the same way is their exact reference
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    return model


def spec(layers: int = LAYERS, **quality) -> dict:
    return {"kind": "serving", "name": "tiny-quality",
            "cluster": {"groups": [{"name": "a", "device": "cpu-local", "count": 1},
                                   {"name": "b", "device": "cpu-local", "count": 1}], "interconnect": "loopback"},
            "serving": {"model": {"layers": layers, "hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "vocab": 256,
                                  "max_positions": 128, "ffn_matrices": 3, "tied_embeddings": False},
                        "prompt_len": 16, "gen_tokens": 8, "global_batch": 4, "bits": [2, 4, 8, 16],
                        "quality": quality, "runtime": {"perplexity_windows": 6}},
            "solver": {"backend": "default", "time_limit_s": 20}}


def test_all_16_bit_served_perplexity_equals_the_models_own():
    """Served at 16 bits everywhere, the model's perplexity is transformers' own forward's on the same windows:
    1e-5 relative against the model with bf16-rounded weights (what 16-bit layers store), 1e-2 against fp32."""
    job = load_spec(spec())
    tokens = qm.text_tokens(job)
    assert tokens.numel() == 6 * 24 + 1
    served = qm.bits_perplexity(tiny(), [16] * LAYERS, tokens, 24, partition=[(0, 1), (1, 3)])
    assert served == pytest.approx(qm.model_perplexity(tiny(), tokens, 24), rel=1e-5)
    assert served == pytest.approx(qm.model_perplexity(tiny(rounded=False), tokens, 24), rel=1e-2)


def test_plan_perplexities_score_the_plan_every_baseline_and_the_uniform_extremes():
    job = load_spec(spec(max_indicator=50.0))
    plan = qsync_opt.solve(spec(max_indicator=50.0))
    model = tiny()
    recs = qm.plan_perplexities(job, plan, model)
    by = {r.policy: r for r in recs}
    assert set(by) == {"plan", "all-16", "all-2"} | {b.name for b in plan.baselines if b.fits}
    assert list(by["plan"].bits) == [b for st in plan.stages for b in st.bits]
    assert by["plan"].sigma_omega == pytest.approx(plan.prediction.quality, rel=1e-9)
    omega, _ = layer_omegas(job.serving.model, [2, 4, 8, 16], None)
    tokens = qm.text_tokens(job)
    for r in recs:
        assert r.sigma_omega == pytest.approx(sum(omega[i][b] for i, b in enumerate(r.bits)), rel=1e-12)
        assert r.perplexity == qm.bits_perplexity(model, list(r.bits), tokens, 24)  # the partition changes nothing
    assert by["all-16"].sigma_omega == 0.0
    assert by["all-16"].perplexity == pytest.approx(qm.model_perplexity(model, tokens, 24), rel=1e-5)


def test_calibration_statistics_equal_a_hand_computation():
    """With one-token windows attention returns V itself, so every linear's input is computable by hand:
    x = RMSNorm(embedding) feeds Q, K, V; V's heads (each shared by 2 query heads) feed O; RMSNorm(h + O(...))
    feeds gate and up; silu(gate)·up feeds down. Σ Var (population, over every token) and max |W| match."""
    model = tiny(layers=2, rounded=False)
    ids = torch.randint(0, 256, (41,), generator=torch.Generator().manual_seed(5))
    doc = qm.calibration_stats(model, ids, window=1)
    assert doc["calibration_tokens"] == 40 and len(doc["layers"]) == 2
    h = model.model.embed_tokens(ids[:40]).double()
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            a, m = layer.self_attn, layer.mlp
            x = layer.input_layernorm.double()(h)
            v = x @ a.v_proj.weight.double().T
            o_in = v.view(40, 2, 1, 16).expand(40, 2, 2, 16).reshape(40, 64)
            h = h + o_in @ a.o_proj.weight.double().T
            xm = layer.post_attention_layernorm.double()(h)
            gate, up = xm @ m.gate_proj.weight.double().T, xm @ m.up_proj.weight.double().T
            d_in = torch.nn.functional.silu(gate) * up
            h = h + d_in @ m.down_proj.weight.double().T
            inputs = {"self_attn.q_proj": x, "self_attn.k_proj": x, "self_attn.v_proj": x, "self_attn.o_proj": o_in,
                      "mlp.gate_proj": xm, "mlp.up_proj": xm, "mlp.down_proj": d_in}
            got = {lin["name"]: lin for lin in doc["layers"][i]["linears"]}
            assert list(got) == list(inputs)
            for name, inp in inputs.items():
                w = layer.get_submodule(name).weight
                assert got[name]["range"] == float(w.abs().max())
                assert got[name]["x_var_sum"] == pytest.approx(float(inp.var(0, unbiased=False).sum()), rel=1e-6)
                assert got[name]["ffn"] == name.startswith("mlp.")


def test_calibrated_stats_file_gives_the_planner_per_layer_omega(tmp_path):
    model = tiny()
    doc = qm.calibration_stats(model, torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(6)), 16)
    path = qm.write_stats(doc, tmp_path / "stats.yaml")
    job = load_spec(spec(stats=str(path)))
    omega, source = layer_omegas(job.serving.model, [4, 16], str(path))
    assert "calibration statistics" in source
    for i, layer in enumerate(doc["layers"]):
        want = sum((lin["range"] / 7) ** 2 * lin["x_var_sum"] * (4.0 if lin["ffn"] else 1.0) for lin in layer["linears"])
        assert omega[i][4] == pytest.approx(want, rel=1e-12) and omega[i][16] == 0.0


def test_empirical_indicator_is_each_layer_alone_minus_the_all_16_model(tmp_path):
    model = tiny()
    job = load_spec(spec())
    tokens = qm.text_tokens(job)
    doc = qm.empirical_indicator(model, [2, 16], tokens, 24)
    ref = qm.bits_perplexity(model, [16] * LAYERS, tokens, 24)
    assert doc["reference_perplexity"] == ref
    for i, layer in enumerate(doc["layers"]):
        assert layer["omega"][16] == 0.0  # measured, not set: the same computation as the reference
        alone = [16] * LAYERS
        alone[i] = 2
        assert layer["omega"][2] == pytest.approx(qm.bits_perplexity(model, alone, tokens, 24) - ref, abs=1e-12)
    assert any(layer["omega"][2] != 0.0 for layer in doc["layers"])
    path = qm.write_stats(doc, tmp_path / "empirical.yaml")
    omega, source = layer_omegas(job.serving.model, [2, 16], str(path), "empirical")
    assert source.startswith("empirical indicator")
    assert omega == [{2: max(0.0, layer["omega"][2]), 16: 0.0} for layer in doc["layers"]]


def test_planner_with_the_empirical_indicator_spares_the_layer_it_measured_as_sensitive(tmp_path):
    """Layer 0 loses much at low bits, the others almost nothing: under Σω ≤ 0.5 the fastest plan keeps layer 0
    at 8 bits (0.1) and puts the rest at 2 (0.01 each); 4 bits on layer 0 (1.0) would break the bound."""
    layers = [{"omega": {2: 10.0, 4: 1.0, 8: 0.1, 16: 0.0}}] + [{"omega": {2: 0.01, 4: 0.001, 8: 0.0, 16: 0.0}}] * 2
    path = tmp_path / "empirical.yaml"
    path.write_text(yaml.safe_dump({"indicator": "empirical", "layers": layers}))
    plan = qsync_opt.solve(spec(indicator="empirical", stats=str(path), max_indicator=0.5))
    assert [b for st in plan.stages for b in st.bits] == [8, 2, 2]
    assert plan.prediction.quality == pytest.approx(0.12, rel=1e-9)
    assert plan.quality_source.startswith("empirical indicator")


def test_bad_indicator_is_exit_2_naming_the_field(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec(indicator="perplexity")))
    assert main(["solve", str(path)]) == 2
    err = capsys.readouterr().err
    assert "serving.quality.indicator" in err and "empirical" in err


def test_empirical_without_its_file_or_with_the_other_indicators_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="serving.quality.*needs stats"):
        load_spec(spec(indicator="empirical"))
    stats = qm.write_stats(qm.calibration_stats(tiny(), torch.arange(100) % 256, 16), tmp_path / "stats.yaml")
    with pytest.raises(SpecError, match="serving.quality.indicator: 'empirical' but .* holds the 'llm-pq'"):
        qsync_opt.solve(spec(indicator="empirical", stats=str(stats)))
    missing = tmp_path / "partial.yaml"
    missing.write_text(yaml.safe_dump({"indicator": "empirical", "layers": [{"omega": {2: 1.0, 16: 0.0}}] * LAYERS}))
    with pytest.raises(SpecError, match=r"layers\[0\].omega has no 4-bit value"):
        qsync_opt.solve(spec(indicator="empirical", stats=str(missing)))


def test_text_too_short_or_vocab_too_small_names_the_field(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("x" * 50)
    s = spec()
    s["serving"]["runtime"]["prompts"] = str(short)
    with pytest.raises(SpecError, match="serving.runtime.perplexity_windows: 6 windows of 24 tokens need 145 bytes"):
        qm.text_tokens(load_spec(s))
    s = spec()
    s["serving"]["model"]["vocab"] = 128
    with pytest.raises(SpecError, match="serving.model.vocab: 128"):
        qm.text_tokens(load_spec(s))
    assert math.isfinite(qm.bits_perplexity(tiny(), [4] * LAYERS, qm.text_tokens(load_spec(spec())), 24))
