"""The zoo: names, published parameter counts, inputs that fit, losses that train, clear errors."""

from __future__ import annotations

import pytest
import torch

from qsync_opt.errors import SpecError
from qsync_opt.models import ZOO, build_model, list_models, load_factory

ALL = [
    "resnet18", "resnet50", "vgg16", "vit-b16", "bert-base", "bert-large", "gpt2-small",
    "gpt2-medium", "tiny-cnn", "tiny-resnet", "tiny-bert", "tiny-gpt2",
    # built by transformers from a config (models/zoo_hf.py)
    "hf-bert-base", "hf-tiny-bert", "hf-gpt2-small", "hf-tiny-gpt2", "hf-llama-small", "hf-tiny-llama",
]
TINY = [n for n in ALL if n.startswith("tiny-")]

# Published parameter counts: torchvision (resnet18/50, vgg16), timm vit_base_patch16_224,
# Hugging Face BertForSequenceClassification (2 labels) and GPT2LMHeadModel (tied head).
PUBLISHED_PARAMS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    "vit-b16": 86_567_656,
    "bert-base": 109_483_778,
    "bert-large": 335_143_938,
    "gpt2-small": 124_439_808,
    "gpt2-medium": 354_823_168,
    "hf-bert-base": 109_483_778,  # the hand-written bert-base and gpt2-small above match transformers' own
    "hf-gpt2-small": 124_439_808,
}


def test_list_models_names_every_model():
    assert list_models() == sorted(ALL)
    assert all(ZOO[n].task in ("classification", "language_modelling") for n in ALL)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_count_matches_published(name):
    with torch.device("meta"):  # shapes only: no memory, no init compute
        model = build_model(name)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_are_deterministic_under_seed(name):
    torch.manual_seed(3)
    a = build_model(name).state_dict()
    torch.manual_seed(3)
    b = build_model(name).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", TINY)
def test_example_batch_fits_model_and_loss_trains(name):
    torch.manual_seed(0)
    entry = ZOO[name]
    model = build_model(name)
    inputs, targets = entry.example_batch(4, generator=torch.Generator().manual_seed(1))
    assert inputs[0].shape[0] == 4 and targets.shape[0] == 4
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(5):  # same batch: a working loss and model must fit it
        opt.zero_grad()
        loss = entry.loss_fn(model(*inputs), (inputs, targets))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]


def test_default_input_shapes():
    assert ZOO["resnet50"].example_inputs(2)[0].shape == (2, 3, 224, 224)
    assert ZOO["vit-b16"].example_inputs(1)[0].shape == (1, 3, 224, 224)
    assert ZOO["tiny-cnn"].example_inputs(3)[0].shape == (3, 1, 40)
    ids = ZOO["bert-base"].example_inputs(2)[0]
    assert ids.shape == (2, 128) and ids.dtype == torch.int64
    assert ZOO["gpt2-small"].example_inputs(1, seq_len=64)[0].shape == (1, 64)
    x, y = ZOO["tiny-gpt2"].example_batch(2, seq_len=16)
    assert x[0].shape == y.shape == (2, 16)


def test_gpt2_is_causal():
    """Logits at position t must not change when later tokens change."""
    torch.manual_seed(0)
    model = build_model("tiny-gpt2").eval()
    ids = ZOO["tiny-gpt2"].example_inputs(1, seq_len=12)[0]
    changed = ids.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 1000
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.allclose(a[0, :8], b[0, :8], atol=1e-5)
    assert not torch.allclose(a[0, 8:], b[0, 8:], atol=1e-5)


def test_factory_kwargs_reach_the_model():
    model = build_model("tiny-resnet", num_classes=7)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 7)
    assert ZOO["tiny-resnet"].example_batch(3, num_classes=7)[1].max() < 7


def test_unknown_model_lists_near_matches():
    with pytest.raises(SpecError, match=r"model\.name: unknown model 'resnet5'.*'resnet50'.*Known models: .*vit-b16"):
        build_model("resnet5")


def test_bad_factory_kwargs_name_the_field():
    with pytest.raises(SpecError, match=r"model\.kwargs: .*'depth'.*'resnet18'"):
        build_model("resnet18", depth=3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"seq_len": 5000}, r"seq_len: got 5000 for bert-base; give an integer in \[1, 512\]"),
        ({"seqlen": 64}, r"unknown option\(s\) \['seqlen'\]"),
    ],
    ids=["too-long", "misspelt"],
)
def test_bad_input_options(kwargs, match):
    with pytest.raises(SpecError, match=match):
        ZOO["bert-base"].example_inputs(1, **kwargs)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_bad_batch_size(bad):
    with pytest.raises(SpecError, match=r"batch_size: got .*integer >= 1"):
        ZOO["tiny-cnn"].example_inputs(bad)


def test_load_factory_resolves_user_path():
    factory = load_factory("qsync_opt.models.zoo_cnn:tiny_cnn")
    assert factory(num_classes=3)(torch.randn(2, 1, 40)).shape == (2, 3)


@pytest.mark.parametrize(
    "path, match",
    [
        ("qsync_opt.models.zoo_cnn.tiny_cnn", r"write it as 'package\.module:factory'"),
        ("no_such_pkg_xyz.mod:f", r"cannot import module 'no_such_pkg_xyz\.mod'"),
        ("qsync_opt.models.zoo_cnn:tiny_cn", r"has no attribute 'tiny_cn'.*'tiny_cnn'"),
        ("qsync_opt.models.zoo_cnn:VGG16_CFG", r"is a tuple, not a callable"),
    ],
    ids=["no-colon", "no-module", "no-attr", "not-callable"],
)
def test_load_factory_errors(path, match):
    with pytest.raises(SpecError, match=match):
        load_factory(path)
