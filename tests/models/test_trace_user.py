"""Tracing a user's own modules: functional ops, naming, leaf modules, and errors that say what to do."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qsync_opt.errors import ModelError, SpecError
from qsync_opt.models import trace


class ResidualMLP(nn.Module):
    """Residual MLP with functional relu, a learned scale and a functional linear."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.scale = nn.Parameter(torch.ones(16))
        self.proj = nn.Parameter(torch.randn(8, 16))

    def forward(self, x):
        h = F.relu(self.fc1(x))
        y = (self.fc2(h) + x) * self.scale
        return F.linear(y, self.proj)


def test_user_module_traces_with_stable_names_and_costs():
    g = trace(ResidualMLP(), torch.randn(4, 16), model_name="mlp")
    assert [(n.name, n.kind, n.selectable) for n in g.nodes] == [
        ("fc1", "linear", True),
        ("root.relu_0", "relu", False),
        ("fc2", "linear", True),
        ("root.add_0", "add", False),
        ("root.mul_0", "mul", False),
        ("root.linear_0", "linear", True),
    ]
    assert g.model == "mlp" and g.batch_size == 4
    fc1 = g.node("fc1")
    assert fc1.fwd_flops == 2 * 4 * 16 * 32 + 4 * 32 and fc1.bwd_flops == 2 * fc1.fwd_flops
    assert fc1.param_count == 16 * 32 + 32 and fc1.weight_shape == (32, 16)
    assert fc1.saved_bytes == 4 * 4 * 16  # its input activation, fp32
    lin = g.node("root.linear_0")  # functional linear: weight from the get_attr parameter
    assert lin.weight_shape == (8, 16) and lin.param_count == 128 and lin.fwd_flops == 2 * 4 * 16 * 8
    assert g.node("root.mul_0").param_count == 16
    assert g.param_count == sum(p.numel() for p in ResidualMLP().parameters())
    # the residual: x feeds the add directly, so the add reads the model input and fc2
    assert ("fc2", "root.add_0") in g.edges
    assert [n.depth for n in g.nodes] == [0, 1, 2, 3, 4, 5]
    assert g.selectable_edges == (("fc1", "fc2"), ("fc2", "root.linear_0"))
    assert g.edge_numel == {("fc1", "fc2"): 4 * 32, ("fc2", "root.linear_0"): 4 * 16}


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.GELU())

    def forward(self, x):
        return torch.matmul(self.inner(x), x.transpose(-1, -2)).softmax(-1)


def test_functional_ops_are_named_after_their_enclosing_module():
    g = trace(Nested(), torch.randn(2, 5, 8))
    assert [n.name for n in g.nodes] == ["inner.0", "inner.1", "root.matmul_0", "root.softmax_0"]
    mm = g.node("root.matmul_0")
    assert mm.selectable and mm.fwd_flops == 2 * 2 * 5 * 5 * 8
    assert mm.input_shapes == ((2, 5, 8), (2, 8, 5)) and mm.saved_bytes == 4 * 2 * 80
    assert ("inner.0", "root.matmul_0") in g.selectable_edges
    assert g.node("root.softmax_0").saved_bytes == 4 * 2 * 25  # softmax keeps its output


class Gate(nn.Module):
    """Data-dependent control flow: symbolic tracing cannot follow it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        if x.sum() > 0:
            return self.lin(x)
        return x


class GatedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.blocks = nn.Sequential(nn.ReLU(), Gate())
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        return self.b(self.blocks(self.a(x)))


def test_untraceable_module_error_names_the_culprit_and_the_fix():
    with pytest.raises(ModelError, match=r"module 'blocks\.1' \(Gate\) broke symbolic tracing.*"
                                         r"leaf_modules=\['blocks\.1'\].*model\.leaf_modules"):
        trace(GatedNet(), torch.randn(2, 16), model_name="gated")


@pytest.mark.parametrize("leaf", ["blocks.1", "Gate", Gate], ids=["fqn", "class-name", "class"])
def test_leaf_modules_make_the_culprit_one_opaque_op(leaf):
    g = trace(GatedNet(), torch.randn(2, 16), leaf_modules=[leaf])
    gate = g.node("blocks.1")
    assert gate.kind == "leaf" and not gate.selectable
    assert gate.param_count == 16 * 16 + 16
    assert gate.fwd_flops == 2 * gate.param_count * 2  # 2 * params * rows (rows = batch 2)
    assert g.selectable_edges == (("a", "b"),)  # through the opaque op


def test_unknown_leaf_name_is_a_spec_error_with_near_match():
    with pytest.raises(SpecError, match=r"model\.leaf_modules: 'Gat' matches no submodule.*'Gate'"):
        trace(GatedNet(), torch.randn(2, 16), leaf_modules=["Gat"])
    with pytest.raises(SpecError, match=r"model\.leaf_modules: 3 is neither"):
        trace(GatedNet(), torch.randn(2, 16), leaf_modules=[3])


class BadRoot(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return self.a(x) if x.sum() > 0 else x


def test_root_control_flow_error_explains_that_leaves_cannot_help():
    with pytest.raises(ModelError, match=r"its own forward \(BadRoot\).*move the data-dependent part"):
        trace(BadRoot(), torch.randn(2, 4))


def test_shape_mismatch_names_the_node_and_the_inputs():
    with pytest.raises(ModelError, match=r"failed at `%fc1.*in module 'fc1'.*Check that example_inputs"):
        trace(ResidualMLP(), torch.randn(4, 15))


@pytest.mark.parametrize("bad", [(), (3,), torch.tensor(1.0)], ids=["empty", "int", "scalar"])
def test_inputs_without_a_batch_dimension_are_rejected(bad):
    with pytest.raises(SpecError, match=r"example_inputs: need at least one tensor with a leading batch"):
        trace(ResidualMLP(), bad)


class Reuse(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(8, 8)

    def forward(self, x):
        return self.shared(torch.relu(self.shared(x)))


def test_second_call_of_a_module_is_named_and_not_selectable():
    g = trace(Reuse(), torch.randn(3, 8))
    assert [(n.name, n.selectable, n.param_count) for n in g.nodes] == [
        ("shared", True, 72), ("root.relu_0", False, 0), ("shared@1", False, 0)]
    assert g.param_count == 72


def test_tracing_leaves_the_module_untouched():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = trace(model, torch.randn(2, 3, 8, 8))
    assert model.training and all(m.training for m in model.modules())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BN running stats not updated
    assert [n.name for n in g.nodes] == ["0", "1", "2", "4"]  # Flatten is a view: dropped
    assert g.selectable_edges == (("0", "4"),) and g.edge_numel[("0", "4")] == 2 * 144
