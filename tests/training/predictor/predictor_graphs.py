"""Hand-built OpGraphs (MLP, conv chain, residual block) and the modules they describe.

FLOPs and bytes are written out here from first principles, independently of the tracer, so
predictor tests do not depend on qsync_opt.models.tracing.
"""

from __future__ import annotations

import math

from torch import nn

from qsync_opt.models.graph import OpGraph, OpNode


def linear(name, batch, fin, fout, depth, bias=True) -> OpNode:
    fwd = 2 * batch * fin * fout + (batch * fout if bias else 0)
    return OpNode(name, "linear", True, ((batch, fin),), (batch, fout), fwd, 2 * fwd,
                  fin * fout + (fout if bias else 0), 4 * batch * fin, depth, (fout, fin))


def conv(name, batch, cin, cout, hw, depth, k=3) -> OpNode:
    out = batch * cout * hw * hw
    fwd = 2 * out * cin * k * k
    return OpNode(name, "conv2d", True, ((batch, cin, hw, hw),), (batch, cout, hw, hw), fwd, 2 * fwd,
                  cout * cin * k * k, 4 * batch * cin * hw * hw, depth, (cout, cin, k, k))


def elementwise(name, kind, shape, depth, params=0, n_inputs=1) -> OpNode:
    n = math.prod(shape)
    return OpNode(name, kind, False, (shape,) * n_inputs, shape, n, n, params, 4 * n, depth)


def mlp_graph(batch=16, fin=64, hidden=128, fout=10) -> OpGraph:
    nodes = (
        linear("fc1", batch, fin, hidden, 0),
        elementwise("act", "relu", (batch, hidden), 1),
        linear("fc2", batch, hidden, fout, 2),
    )
    return OpGraph("mlp", batch, nodes, (("fc1", "act"), ("act", "fc2")), (("fc1", "fc2"),),
                   {("fc1", "fc2"): batch * hidden}, 3)


class MLP(nn.Module):
    def __init__(self, fin=64, hidden=128, fout=10):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(fin, hidden), nn.ReLU(), nn.Linear(hidden, fout)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def conv_chain_graph(batch=8, c=16, hw=16) -> OpGraph:
    s = (batch, c, hw, hw)
    nodes = (
        conv("conv1", batch, 3, c, hw, 0),
        elementwise("bn1", "batch_norm", s, 1, params=2 * c),
        elementwise("relu1", "relu", s, 2),
        conv("conv2", batch, c, c, hw, 3),
        elementwise("bn2", "batch_norm", s, 4, params=2 * c),
        elementwise("relu2", "relu", s, 5),
        conv("conv3", batch, c, c, hw, 6),
    )
    names = [n.name for n in nodes]
    edges = tuple(zip(names, names[1:]))
    sel = (("conv1", "conv2"), ("conv2", "conv3"))
    return OpGraph("convchain", batch, nodes, edges, sel, {e: math.prod(s) for e in sel}, 7)


def residual_graph(batch=8, c=16, hw=8) -> OpGraph:
    s = (batch, c, hw, hw)
    nodes = (
        conv("stem", batch, 3, c, hw, 0),
        conv("conv1", batch, c, c, hw, 1),
        elementwise("relu1", "relu", s, 2),
        conv("conv2", batch, c, c, hw, 3),
        elementwise("add", "add", s, 4, n_inputs=2),
        elementwise("relu2", "relu", s, 5),
    )
    edges = (("stem", "conv1"), ("conv1", "relu1"), ("relu1", "conv2"), ("conv2", "add"),
             ("stem", "add"), ("add", "relu2"))
    sel = (("stem", "conv1"), ("conv1", "conv2"))
    return OpGraph("residual", batch, nodes, edges, sel, {e: math.prod(s) for e in sel}, 6)


SPEC_V100_T4 = """
cluster:
  groups:
    - {name: v100, device: V100-32GB, count: 2}
    - {name: t4, device: T4, count: 2}
  interconnect: ethernet-100g
model: {name: resnet50}
training: {global_batch: 64, optimizer: momentum}
"""


def flat_omega(graph: OpGraph, precisions=("fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")):
    """ω growing as precision drops, equal for every op: enough for cost-side tests."""
    return {n.name: {p: float(i) for i, p in enumerate(precisions)} for n in graph.selectable}


def deep_mlp_graph(batch=64, width=2048, layers=6) -> OpGraph:
    """linear/relu pairs; each linear holds 16.8 MB of FP32 gradients at width 2048 (several DDP buckets)."""
    nodes, edges, sel = [], [], []
    for i in range(layers):
        nodes.append(linear(f"fc{i}", batch, width, width, 2 * i))
        nodes.append(elementwise(f"act{i}", "relu", (batch, width), 2 * i + 1))
    names = [n.name for n in nodes]
    edges = tuple(zip(names, names[1:]))
    sel = tuple((f"fc{i}", f"fc{i + 1}") for i in range(layers - 1))
    return OpGraph("deep-mlp", batch, tuple(nodes), edges, sel, {e: batch * width for e in sel}, 2 * layers)
