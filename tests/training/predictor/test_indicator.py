"""Sensitivity indicators: ordering over formats, scaling, depth loading, GVAR by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from predictor_graphs import MLP, elementwise, linear, mlp_graph
from qsync_opt.errors import ModelError, SpecError
from qsync_opt.models.graph import OpGraph
from qsync_opt.training.predictor.gvar import gvar_indicator
from qsync_opt.training.predictor.indicator import Sensitivity, weight_indicator, weight_noise

ALL = ("fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")


def _batches(n=3, batch=16, fin=64, classes=10):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, fin, generator=g), torch.randint(0, classes, (batch,), generator=g)) for _ in range(n)]


def _loss(out, batch):
    return nn.functional.cross_entropy(out, batch[1])


def _assert_ordered(w: dict[str, float]):
    assert w["fp32"] == 0.0
    assert w["int4"] >= w["int8"] >= w["fp16"] > 0
    assert w["fp8_e5m2"] >= w["fp8_e4m3"] >= w["bf16"] >= w["fp16"]
    assert w["tf32"] == pytest.approx(w["fp16"])  # both round to 10 mantissa bits


def test_weight_indicator_orders_formats(seeded):
    s = weight_indicator(MLP(), mlp_graph(), ALL)
    assert isinstance(s, Sensitivity) and s.method == "weight"
    for op in ("fc1", "fc2"):
        _assert_ordered(s.omega[op])


def test_normalised_to_one_at_the_lowest_format(seeded):
    s = weight_indicator(MLP(), mlp_graph(), ("fp32", "bf16", "int8"))
    assert s.reference == "int8"
    assert sum(v["int8"] for v in s.omega.values()) == pytest.approx(1.0)
    back = Sensitivity.from_dict(s.to_dict())
    assert back == s


def test_int8_against_fp8_depends_on_outliers(seeded):
    w = torch.randn(256, 256)
    assert weight_noise(w, "int8") < weight_noise(w, "fp8_e4m3")  # Gaussian: 7 bits of range beat 3 of mantissa
    w[0, 0] = 100.0  # one outlier stretches the int8 scale 25x
    assert weight_noise(w, "int8") > weight_noise(w, "fp8_e4m3")


def test_noise_by_hand():
    w = torch.tensor([[1.0, -0.5], [0.25, 2.0]])
    s = 2.0 / 127
    assert weight_noise(w, "int8") == pytest.approx(s * s / 12 * 4)
    assert weight_noise(w, "int4") == pytest.approx((2.0 / 7) ** 2 / 12 * 4)
    assert weight_noise(w, "bf16") == pytest.approx(2.0 ** -16 / 3 * (1 + 0.25 + 0.0625 + 4))


@pytest.mark.parametrize("method", ["weight", "gvar"])
def test_raw_indicator_scales_with_the_square_of_the_weights(seeded, method):
    model, graph = MLP(), mlp_graph()

    def raw(m):
        if method == "weight":
            s = weight_indicator(m, graph, ("fp32", "int8"))
        else:
            s = gvar_indicator(m, graph, _batches(1), _loss, ("fp32", "int8"))
        return {op: v["int8"] * s.scale for op, v in s.omega.items()}

    before = raw(model)
    with torch.no_grad():
        model.fc1.weight.mul_(2.0)
    after = raw(model)
    if method == "weight":
        assert after["fc1"] == pytest.approx(4 * before["fc1"])  # s² and Σw² are both quadratic
        assert after["fc2"] == pytest.approx(before["fc2"])
    else:
        assert after["fc1"] > 1.9 * before["fc1"]  # F's ‖X‖·s_w² term is quadratic in W, the rest grows


def _twin_graph():
    nodes = (linear("a", 16, 32, 32, 0), elementwise("act", "relu", (16, 32), 1), linear("b", 16, 32, 32, 2))
    return OpGraph("twin", 16, nodes, (("a", "act"), ("act", "b")), (("a", "b"),), {("a", "b"): 512}, 3)


class _Twin(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.act, self.b = nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight)

    def forward(self, x):
        return self.b(self.act(self.a(x)))


def test_depth_loading_weights_identical_ops(seeded):
    s = weight_indicator(_Twin(), _twin_graph(), ("fp32", "int8"))
    # ω ∝ γ(L − d) + d with γ = 4, L = 3: a (d=0) 12, b (d=2) 6
    assert s.omega["a"]["int8"] / s.omega["b"]["int8"] == pytest.approx(2.0)


def test_gvar_orders_formats_and_is_nonzero_everywhere(seeded):
    s = gvar_indicator(MLP(), mlp_graph(), _batches(), _loss, ALL, backward_precision="bf16")
    assert s.method == "gvar"
    for op in ("fc1", "fc2"):
        _assert_ordered(s.omega[op])
        assert s.omega[op]["int8"] > 0
    assert sum(v["int4"] for v in s.omega.values()) == pytest.approx(1.0)


def test_gvar_int8_by_hand_on_one_linear(seeded):
    lin = nn.Linear(8, 4)
    graph = OpGraph("one", 5, (linear("0", 5, 8, 4, 0),), (), (), {}, 1)
    model = nn.Sequential(lin)
    x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    s = gvar_indicator(model, graph, [(x, y)], _loss, ("fp32", "int8"))
    w = lin.weight.detach()
    s_x, s_w = x.abs().max().item() / 127, w.abs().max().item() / 127
    F = (w.norm().item() * s_x**2 * x.numel() + x.norm().item() * s_w**2 * w.numel()) / 6
    # depth 0 of L = 1: ω = γ·1·F + 0·B
    assert s.omega["0"]["int8"] * s.scale == pytest.approx(4 * F, rel=1e-5)


def test_gvar_leaves_the_module_untouched(seeded):
    model = MLP()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    gvar_indicator(model, mlp_graph(), _batches(), _loss, ("fp32", "int8"))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_bad_inputs_raise_named_errors(seeded):
    with pytest.raises(SpecError, match="precisions: got an empty list"):
        weight_indicator(MLP(), mlp_graph(), [])
    with pytest.raises(SpecError, match=r"precisions: unknown \['int3'\]"):
        weight_indicator(MLP(), mlp_graph(), ["fp32", "int3"])
    with pytest.raises(SpecError, match="calibration_batches: got no batches"):
        gvar_indicator(MLP(), mlp_graph(), [], _loss, ("fp32", "int8"))
    with pytest.raises(ModelError, match="fc1.*pass the module the graph was traced from"):
        weight_indicator(nn.Sequential(nn.Linear(64, 10)), mlp_graph(), ("fp32", "int8"))


def test_gvar_on_tiny_bert_covers_embeddings_and_attention_products(seeded):
    zoo = pytest.importorskip("qsync_opt.models.zoo", reason="model zoo not available")
    from qsync_opt.models.tracing import trace

    entry = zoo.ZOO["tiny-bert"]
    model = zoo.build_model("tiny-bert")
    graph = trace(model, entry.example_inputs(4), model_name="tiny-bert")
    batches = [entry.example_batch(4, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    s = gvar_indicator(model, graph, batches, entry.loss_fn, ("fp32", "bf16", "int8"))
    kinds = {n.name: n.kind for n in graph.selectable}
    assert {"embedding", "matmul", "linear"} <= set(kinds.values())
    for op, w in s.omega.items():
        assert w["int8"] >= w["bf16"] >= w["fp32"] == 0.0, op
        assert w["int8"] > 0, op
    weight = weight_indicator(model, graph, ("fp32", "bf16", "int8"))
    assert set(weight.omega) == set(s.omega)
    assert not math.isnan(sum(v["int8"] for v in weight.omega.values()))
