"""Weights one tensor at a time: the replayed init gives the real build's bits, or refuses."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qsync_opt.models.lazy_weights import build_recorded, dense_during_calls, zero_stride_twin
from qsync_opt.models.private_rng import private_rng
from qsync_opt.models.zoo import build_model, get_entry
from qsync_opt.training.predictor.indicator import weight_stats


def _exact(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


_HF_TINY = [pytest.param(n, marks=pytest.mark.skipif(not __import__("importlib").util.find_spec("transformers"),
                                                     reason="transformers not installed"))
            for n in ("hf-tiny-bert", "hf-tiny-gpt2", "hf-tiny-llama")]


@pytest.mark.parametrize("name", ["tiny-resnet", "tiny-bert", "tiny-gpt2", "tiny-cnn", *_HF_TINY])
def test_replayed_tensors_are_the_real_builds_bit_for_bit(name):
    """Every parameter and buffer; transformers models included (their init_weights skips on meta
    unless told otherwise: lazy_weights._hf_inits_run_on_meta)."""
    if name.startswith("hf-"):  # transformers imported before the recorded build (as pipeline's warm_imports does)
        __import__("transformers.modeling_utils")
    module, rec = build_recorded(lambda: build_model(name), 11)
    names = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
    tensors = {n: (module.get_parameter(n) if n in dict(module.named_parameters()) else module.get_buffer(n))
               for n in names}
    got = rec.tensor_stats(tensors, _exact)
    assert got is not None, rec.refused
    with private_rng(11):
        ref = build_model(name)
    ref_tensors = {**dict(ref.named_parameters()), **dict(ref.named_buffers())}
    for n in names:
        assert torch.equal(got[n], ref_tensors[n].detach()), n
    assert all(p.device.type == "meta" for p in module.parameters())  # and nothing was materialised in the module


def test_stats_of_a_tied_weight_and_of_a_partly_written_one():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 8, padding_idx=0)  # normal_, then row 0 filled: a partial write
            self.head = nn.Linear(8, 50, bias=False)
            self.head.weight = self.emb.weight  # tied

    module, rec = build_recorded(M, 3)
    got = rec.tensor_stats({"emb": module.emb.weight, "head": module.head.weight}, weight_stats)
    with private_rng(3):
        ref = M()
    assert got["emb"] == got["head"] == weight_stats(ref.emb.weight)


def test_a_factory_drawing_with_torch_randn_replays_bit_for_bit():
    """torch.randn(...) in a constructor records aten.randn.default, which takes no generator: the
    replay draws through aten.randn.generator, the same values (ViT's position embedding does this)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(torch.randn(1, 10, 32))
            self.fc = nn.Linear(32, 8)

    module, rec = build_recorded(M, 5)
    got = rec.tensor_stats(dict(module.named_parameters()), _exact)
    assert got is not None, rec.refused
    with private_rng(5):
        ref = M()
    for n, p in ref.named_parameters():
        assert torch.equal(got[n], p.detach()), n


class _Trunc(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        nn.init.trunc_normal_(self.fc.weight)  # returns early on meta: no replay could know its draws


class _OwnGenerator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        nn.init.normal_(self.fc.weight, generator=torch.Generator().manual_seed(1))


class _Uninitialised(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(4, 4))


@pytest.mark.parametrize("factory", [_Trunc, _OwnGenerator, _Uninitialised], ids=lambda f: f.__name__)
def test_refuses_what_it_cannot_replay_exactly(factory):
    module, rec = build_recorded(factory, 0)
    tensors = dict(module.named_parameters())
    assert rec.tensor_stats(tensors, weight_stats) is None


def test_zero_stride_twin_traces_to_the_same_graph_holding_no_weights():
    from qsync_opt.models.tracing import trace

    module, _ = build_recorded(lambda: build_model("tiny-bert"), 0)
    meta_of = zero_stride_twin(module)
    assert all(p.device.type == "cpu" and p.untyped_storage().nbytes() <= 8 for p in module.parameters())
    assert len(meta_of) == len(list(module.parameters())) + len(list(module.buffers()))
    x = get_entry("tiny-bert").example_inputs(1, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    reference = trace(build_model("tiny-bert"), x)
    assert trace(module, x) == reference
    with dense_during_calls(module):  # contiguous zeros only while each module runs
        assert trace(module, x) == reference
    assert all(p.untyped_storage().nbytes() <= 8 for p in module.parameters())


def test_light_and_full_prepare_give_the_same_graph_and_indicator(monkeypatch):
    from qsync_opt.training.pipeline import prepare
    from qsync_opt.training.predictor import weight_stream
    from qsync_opt.training.spec import load_spec

    monkeypatch.setattr(weight_stream, "LIGHT_MIN_BYTES", 0)  # tiny models are built for real by default
    spec = load_spec({"cluster": {"groups": [{"name": "cpu", "device": "cpu-local"}]}, "model": {"name": "tiny-resnet"},
                      "training": {"global_batch": 8}})
    light = prepare(spec)
    assert "one tensor at a time" in light.indicator_note
    assert all(p.untyped_storage().nbytes() <= 8 for p in light.module.parameters())
    monkeypatch.setattr(weight_stream, "light_capable", lambda spec: False)
    full = prepare(spec)
    assert full.graph == light.graph
    assert full.sensitivity.omega == light.sensitivity.omega


@pytest.mark.parametrize("name", ["hf-tiny-bert", "hf-tiny-llama"])
def test_light_prepare_of_an_exported_model_overlaps_the_replay_and_matches_the_full_one(monkeypatch, name):
    """transformers models go through torch.export; there the init replay runs on a worker thread
    beside the capture (pipeline._prepare_light): the same graph and ω as the full build, bit for bit."""
    pytest.importorskip("transformers")
    from qsync_opt.training.pipeline import prepare
    from qsync_opt.training.predictor import weight_stream
    from qsync_opt.training.spec import load_spec

    monkeypatch.setattr(weight_stream, "LIGHT_MIN_BYTES", 0)  # tiny models are built for real by default
    started = []
    real_start = weight_stream.start_weight_stats
    monkeypatch.setattr(weight_stream, "start_weight_stats", lambda *a: started.append(1) or real_start(*a))
    spec = load_spec({"cluster": {"groups": [{"name": "cpu", "device": "cpu-local"}]},
                      "model": {"name": name}, "training": {"global_batch": 8}})
    light = prepare(spec)
    assert started == [1] and "one tensor at a time" in light.indicator_note
    monkeypatch.setattr(weight_stream, "light_capable", lambda spec: False)
    full = prepare(spec)
    assert full.graph == light.graph
    assert full.sensitivity.omega == light.sensitivity.omega


def test_a_transformers_build_that_imports_transformers_itself_refuses_rather_than_lie():
    """Imported inside the recorded build, transformers' init_weights could not be told the CPU: the
    recording must refuse (the caller builds for real) instead of replaying the constructors' init."""
    pytest.importorskip("transformers")
    import sys
    saved = {k: v for k, v in sys.modules.items() if k == "transformers" or k.startswith("transformers.")}
    for k in saved:
        del sys.modules[k]
    try:
        _, rec = build_recorded(lambda: build_model("hf-tiny-bert"), 0)
        assert "init_weights" in rec.refused
    finally:
        for k in [k for k in sys.modules if k == "transformers" or k.startswith("transformers.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def test_only_models_big_enough_to_matter_are_streamed(monkeypatch):
    """A small model is built for real (faster than recording and replaying); from LIGHT_MIN_BYTES up
    the weights are streamed. The plan is the same either way (the test above)."""
    from qsync_opt.training.pipeline import prepare
    from qsync_opt.training.predictor import weight_stream
    from qsync_opt.training.spec import load_spec

    spec = load_spec({"cluster": {"groups": [{"name": "cpu", "device": "cpu-local"}]}, "model": {"name": "tiny-resnet"},
                      "training": {"global_batch": 8}})
    assert weight_stream._parameter_bytes(spec) < weight_stream.LIGHT_MIN_BYTES
    assert "one tensor at a time" not in prepare(spec).indicator_note
    monkeypatch.setattr(weight_stream, "LIGHT_MIN_BYTES", int(weight_stream._parameter_bytes(spec)))
    assert "one tensor at a time" in prepare(spec).indicator_note
