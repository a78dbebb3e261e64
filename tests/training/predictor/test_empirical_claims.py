"""The empirical indicator measures what training runs: functional GEMMs included, against a hand computation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qsync_opt.models.tracing import trace
from qsync_opt.training.predictor.empirical import empirical_indicator, loss_changes


class FunctionalNet(nn.Module):
    """A user's net whose first GEMM is `F.linear` on its own parameters."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 16) / 4)
        self.b = nn.Parameter(torch.randn(32) / 4)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(torch.relu(F.linear(x, self.w, self.b)))


def functional_net() -> FunctionalNet:
    """model.import factory for the spec test below."""
    torch.manual_seed(0)
    return FunctionalNet()


class ModuleNet(nn.Module):
    """The same maths with `nn.Linear`: what the runtime's rewrite turns FunctionalNet into."""

    def __init__(self, f: FunctionalNet):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.fc.weight, self.fc.bias = f.w, f.b
        self.head = f.head

    def forward(self, x):
        return self.head(torch.relu(self.fc(x)))


def _setup():
    torch.manual_seed(0)
    net = FunctionalNet()
    g = torch.Generator().manual_seed(1)
    batches = [((torch.randn(64, 16, generator=g),), torch.randint(0, 10, (64,), generator=g)) for _ in range(2)]
    graph = trace(net, batches[0][0], model_name="functional")
    return net, graph, batches


def _hand_bf16_change(net: FunctionalNet, batches) -> float:
    """|L − L_fp32| with F.linear alone computed in bf16 (inputs, weight, bias cast; output back to fp32)."""
    def loss(low: bool) -> float:
        total = 0.0
        for (x,), y in batches:
            h = (F.linear(x.bfloat16(), net.w.bfloat16(), net.b.bfloat16()).float() if low else F.linear(x, net.w, net.b))
            total += float(F.cross_entropy(net.head(torch.relu(h)), y))
        return total / len(batches)

    with torch.no_grad():
        return abs(loss(True) - loss(False))


def test_functional_linear_is_measured_like_a_module():
    net, graph, batches = _setup()
    fqn = "root.linear_0"
    assert fqn in [n.name for n in graph.selectable]
    raw, _ = loss_changes(net, [fqn, "head"], batches, F.cross_entropy, ["fp32", "bf16", "int8"])
    assert raw[fqn]["int8"] > 0 and raw[fqn]["bf16"] > 0
    # exactly what the same GEMM as an nn.Linear measures
    ref, _ = loss_changes(ModuleNet(net), ["fc"], batches, F.cross_entropy, ["fp32", "bf16", "int8"])
    assert raw[fqn]["int8"] == ref["fc"]["int8"] and raw[fqn]["bf16"] == ref["fc"]["bf16"]
    sens = empirical_indicator(net, graph, batches, F.cross_entropy, ["fp32", "bf16", "int8"])
    assert not any("not swappable" in n for n in sens.notes)


def test_empirical_change_matches_a_hand_computation():
    net, _, batches = _setup()
    raw, _ = loss_changes(net, ["root.linear_0"], batches, F.cross_entropy, ["fp32", "bf16"])
    want = _hand_bf16_change(net, batches)
    assert want > 1e-6  # bf16 rounding changes the loss measurably here
    assert abs(raw["root.linear_0"]["bf16"] - want) <= 1e-6 + 1e-3 * want


def test_spec_with_an_imported_functional_net_gets_measured_omega(tmp_path, monkeypatch):
    """The issue's case: `model.import` of a net calling F.linear (FunctionalNet, from this module), indicator
    empirical, through the spec."""
    from qsync_opt.training.predictor.indicators import compute_indicator
    from qsync_opt.training.spec import load_spec

    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path / "cache"))
    spec = load_spec({
        "cluster": {"groups": [{"name": "cpu", "device": "cpu-local", "precisions": ["fp32", "bf16", "int8"]}]},
        "model": {"import": f"{__name__}:functional_net", "input_shape": [16]},
        "training": {"global_batch": 16, "optimizer": "sgd"},
        "indicator": {"method": "empirical", "calibration": {"batches": 2, "batch_size": 16}},
    })
    sens, _ = compute_indicator(spec)
    assert sens.omega["root.linear_0"]["int8"] > 0 and sens.omega["root.linear_0"]["bf16"] > 0
    assert not any("not swappable" in n for n in sens.notes)
