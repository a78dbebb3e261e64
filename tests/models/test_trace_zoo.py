"""Tracing every zoo model: FLOPs against independent analytic counts and published figures,
FQN names, parameter totals, selectable edges, batch scaling and serialisation."""

from __future__ import annotations

import json
import time

import pytest
import torch

from qsync_opt.models import ZOO, OpGraph, build_model, trace

GEMM = ("conv1d", "conv2d", "linear", "matmul", "bmm")
BIG = {"resnet18", "resnet50", "vgg16", "vit-b16", "bert-base", "bert-large", "gpt2-small", "gpt2-medium",
       "hf-bert-base", "hf-gpt2-small", "hf-llama-small"}
SEQ = 32  # short sequences keep the full-size transformers cheap


def _graph(name: str, batch: int = 1, seq_len: int = SEQ) -> tuple[torch.nn.Module, OpGraph]:
    """Full-size models are built and traced on the meta device: shapes without compute."""
    torch.manual_seed(0)
    entry = ZOO[name]
    kw = {"seq_len": seq_len} if entry.input_kind == "tokens" else {}
    if name in BIG:
        with torch.device("meta"):
            model = build_model(name)
        return model, trace(model, entry.example_inputs(batch, device="meta", **kw), model_name=name)
    model = build_model(name)
    return model, trace(model, entry.example_inputs(batch, **kw), model_name=name)


_CACHE: dict[tuple, tuple] = {}


def graph(name: str, batch: int = 1, seq_len: int = SEQ):
    key = (name, batch, seq_len)
    if key not in _CACHE:
        _CACHE[key] = _graph(name, batch, seq_len)
    return _CACHE[key]


def gemm_macs(g: OpGraph) -> float:
    return sum(n.fwd_flops for n in g.nodes if n.kind in GEMM) / 2


# --- independent analytic counts (multiply-accumulates, one image / one sequence) ------------
def resnet_macs(bottleneck: bool, layers, num_classes=1000) -> int:
    macs = 112 * 112 * 64 * 3 * 49  # 7x7/2 stem
    size, cin = 56, 64
    for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
        for b in range(blocks):
            stride = 2 if stage > 0 and b == 0 else 1
            out = size // stride
            if bottleneck:
                cout = planes * 4
                macs += size * size * cin * planes  # 1x1 reduce
                macs += out * out * planes * planes * 9  # 3x3 (strided)
                macs += out * out * planes * cout  # 1x1 expand
            else:
                cout = planes
                macs += out * out * cin * planes * 9 + out * out * planes * planes * 9
            if b == 0 and (stride != 1 or cin != cout):
                macs += out * out * cin * cout  # 1x1 downsample
            size, cin = out, cout
    return macs + cin * num_classes


def vgg16_macs() -> int:
    macs, size, cin = 0, 224, 3
    for stage in ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512)):
        for cout in stage:
            macs += size * size * cin * cout * 9
            cin = cout
        size //= 2
    return macs + 25088 * 4096 + 4096 * 4096 + 4096 * 1000


def encoder_macs(t: int, h: int, layers: int, ffn: int) -> int:
    """Per sequence: QKV + output projections, the two attention products, the MLP."""
    return layers * (4 * t * h * h + 2 * t * t * h + 2 * t * h * ffn)


def vit_macs() -> int:
    t = 197
    return 196 * 768 * 3 * 256 + encoder_macs(t, 768, 12, 3072) + 768 * 1000


def bert_macs(t, h, layers, ffn) -> int:
    return encoder_macs(t, h, layers, ffn) + h * h + h * 2  # + pooler + 2-label head


def gpt2_macs(t, h, layers, vocab=50257) -> int:
    return encoder_macs(t, h, layers, 4 * h) + t * h * vocab  # + LM head


ANALYTIC = {
    "resnet18": lambda: resnet_macs(False, (2, 2, 2, 2)),
    "resnet50": lambda: resnet_macs(True, (3, 4, 6, 3)),
    "vgg16": vgg16_macs,
    "vit-b16": vit_macs,
    "bert-base": lambda: bert_macs(SEQ, 768, 12, 3072),
    "bert-large": lambda: bert_macs(SEQ, 1024, 24, 4096),
    "gpt2-small": lambda: gpt2_macs(SEQ, 768, 12),
    "gpt2-medium": lambda: gpt2_macs(SEQ, 1024, 24),
}
# Published forward GMACs at 224x224 (torchvision / timm model cards).
PUBLISHED_GMACS = {"resnet18": 1.82, "resnet50": 4.11, "vgg16": 15.5, "vit-b16": 17.6}


@pytest.mark.parametrize("name", sorted(ANALYTIC))
def test_gemm_flops_match_analytic_count(name):
    _, g = graph(name)
    assert gemm_macs(g) == pytest.approx(ANALYTIC[name](), rel=0.01)


@pytest.mark.parametrize("name", sorted(PUBLISHED_GMACS))
def test_gemm_flops_match_published_gmacs(name):
    _, g = graph(name)
    assert gemm_macs(g) / 1e9 == pytest.approx(PUBLISHED_GMACS[name], rel=0.015)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_zoo_model_traces_consistently(name):
    model, g = graph(name)
    names = [n.name for n in g.nodes]
    assert len(names) == len(set(names))
    # parameters are all attributed once (tied GPT-2 head counted at the embedding)
    assert g.param_count == sum(p.numel() for p in model.parameters())
    # selectable ops are exactly the GEMM/embedding kinds and are real, addressable modules
    assert g.selectable and all(n.kind in ("conv1d", "conv2d", "linear", "matmul", "embedding") for n in g.selectable)
    modules = dict(model.named_modules())
    for n in g.selectable:
        assert model.get_submodule(n.name) is modules[n.name]
    for n in g.nodes:  # module ops by FQN; functional ops by "<enclosing FQN or root>.<fn>_<k>"
        parent, _, leaf = n.name.rpartition(".")
        assert n.name in modules or ((parent in modules or parent == "root") and leaf[-1].isdigit()), n.name
    # edges run between known ops, forward in depth; depth is one more than the deepest op
    index = {n: i for i, n in enumerate(names)}
    for a, b in g.edges:
        assert index[a] < index[b] and g.node(a).depth < g.node(b).depth
    assert g.depth == max(n.depth for n in g.nodes) + 1
    sel = {n.name for n in g.selectable}
    assert all(a in sel and b in sel for a, b in g.selectable_edges)
    assert set(g.edge_numel) == set(g.selectable_edges) and all(v > 0 for v in g.edge_numel.values())
    assert g.batch_size == 1
    assert all(n.bwd_flops >= n.fwd_flops > 0 for n in g.nodes if n.kind in GEMM)


def test_transformer_attention_products_are_selectable_matmuls():
    _, g = graph("bert-base")
    qk = g.node("bert.encoder.layer.3.attention.self.qk")
    assert qk.kind == "matmul" and qk.selectable
    assert qk.input_shapes == ((1, 12, SEQ, 64), (1, 12, 64, SEQ)) and qk.output_shape == (1, 12, SEQ, SEQ)
    assert qk.fwd_flops == 2 * 12 * SEQ * SEQ * 64
    # q and k both come from their projections; probabilities reach av through softmax/dropout
    edges = set(g.selectable_edges)
    pre = "bert.encoder.layer.3.attention.self."
    assert {(pre + "query", pre + "qk"), (pre + "key", pre + "qk"), (pre + "qk", pre + "av"),
            (pre + "value", pre + "av")} <= edges
    assert g.edge_numel[(pre + "qk", pre + "av")] == 12 * SEQ * SEQ


def test_resnet_selectable_edges_cross_bn_relu_and_residual_add():
    _, g = graph("resnet50")
    edges = set(g.selectable_edges)
    assert ("layer1.0.conv1", "layer1.0.conv2") in edges  # across bn1 + relu1
    assert ("layer1.0.conv2", "layer1.0.conv3") in edges
    # through bn3 -> add -> relu3 into the next block, and the shortcut conv through the add
    assert ("layer1.0.conv3", "layer1.1.conv1") in edges
    assert ("layer1.0.downsample.0", "layer1.1.conv1") in edges
    # the residual stream is cut after one merge (trace.MAX_MERGES): block 0 does not pair
    # with block 2, or every layer would pair with every later one
    assert ("layer1.0.conv3", "layer1.2.conv1") not in edges
    assert len(edges) < 1.2 * len(g.selectable)
    assert ("layer4.2.conv3", "fc") in edges
    assert ("layer1.0.conv1", "layer1.0.conv3") not in edges  # conv2 is in between
    assert g.edge_numel[("layer1.0.conv1", "layer1.0.conv2")] == 64 * 56 * 56
    assert g.node("conv1").depth == 0
    relu = g.node("layer1.0.relu1")
    assert relu.kind == "relu" and not relu.selectable and relu.saved_bytes == 4 * 64 * 56 * 56


def test_for_batch_scales_flops_like_a_real_trace():
    _, g2 = graph("resnet18", batch=2)
    _, g6 = graph("resnet18", batch=6)
    scaled = g2.for_batch(6)
    assert scaled.batch_size == 6 == g6.batch_size
    for a, b in zip(scaled.nodes, g6.nodes):
        assert (a.name, a.fwd_flops, a.bwd_flops, a.saved_bytes, a.output_shape) == (
            b.name, b.fwd_flops, b.bwd_flops, b.saved_bytes, b.output_shape)
    assert scaled.edge_numel == g6.edge_numel
    assert gemm_macs(g6) == pytest.approx(6 * ANALYTIC["resnet18"](), rel=0.01)


@pytest.mark.parametrize("name", ["tiny-cnn", "tiny-gpt2", "resnet18"])
def test_to_dict_round_trip(name):
    _, g = graph(name)
    back = OpGraph.from_dict(json.loads(json.dumps(g.to_dict())))
    assert back == g


def test_tiny_cnn_is_conv1d():
    _, g = graph("tiny-cnn")
    assert [n.kind for n in g.selectable] == ["conv1d", "conv1d", "conv1d", "linear"]
    c1 = g.node("conv1")
    # 2 * Cout * Lout * Cin * k + bias = 2*32*20*1*5 + 32*20
    assert c1.output_shape == (1, 32, 20) and c1.fwd_flops == 2 * 32 * 20 * 5 + 32 * 20


def test_tracing_time_is_measured(capsys):
    """Not asserted (timing depends on the machine): printed for the report."""
    torch.manual_seed(0)
    model = build_model("resnet50")
    x = ZOO["resnet50"].example_inputs(1)
    t0 = time.perf_counter()
    g = trace(model, x, model_name="resnet50")
    dt = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n[trace] resnet50 batch 1 on CPU: {dt:.2f} s, {len(g.nodes)} ops")
    assert len(g.selectable) == 54  # 53 convs + fc
