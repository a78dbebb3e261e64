"""The model zoo: named factories with matching random inputs, targets and a training loss.

Random weights only (no downloads). Every model is deterministic under torch.manual_seed, and
every factory accepts `device` through torch's default-device context (build on "meta" to
trace a large model without allocating it). Inputs:

- images: float (B, 3, S, S), S = 224 (tiny-resnet: 32); targets: int64 class ids (B,)
- signals (tiny-cnn, MNIST-1D-sized): float (B, 1, 40); targets (B,)
- tokens: int64 ids (B, seq_len); BERT targets are class ids (B,), GPT-2 targets the next
  tokens (B, seq_len). Default seq_len: 128 for BERT, 512 for GPT-2 (half its 1024 context,
  a common fine-tuning length that keeps CPU tracing affordable), 32 for the tiny ones.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from qsync_opt.errors import SpecError
from qsync_opt.models import zoo_cnn as cnn
from qsync_opt.models import zoo_hf  # transformers-built BERT / GPT-2 / Llama; imports transformers lazily
from qsync_opt.models import zoo_transformer as tr
from qsync_opt.spec.importing import resolve_callable

Task = Literal["classification", "language_modelling"]
InputKind = Literal["image", "signal", "tokens"]


@dataclass(frozen=True)
class ModelEntry:
    """A zoo model: how to build it and how to feed it."""

    name: str
    factory: Callable[..., nn.Module]
    task: Task
    input_kind: InputKind
    description: str
    defaults: dict[str, int] = field(default_factory=dict)
    """Input defaults: image_size / length, seq_len, vocab_size, num_classes."""

    def build(self, **kwargs) -> nn.Module:
        return build_model(self.name, **kwargs)

    def example_inputs(self, batch_size: int, **kwargs) -> tuple[torch.Tensor]:
        """Random forward arguments. kwargs: seq_len / image_size / length, vocab_size,
        device, generator (a torch.Generator for reproducible data)."""
        opts = self._options(batch_size, kwargs, allow=("num_classes",))
        b, dev, gen = batch_size, opts["device"], opts["generator"]
        if self.input_kind == "tokens":
            shape = (b, opts["seq_len"])
            return (torch.randint(0, opts["vocab_size"], shape, device=dev, generator=gen),)
        if self.input_kind == "signal":
            return (torch.randn(b, 1, opts["length"], device=dev, generator=gen),)
        s = opts["image_size"]
        return (torch.randn(b, 3, s, s, device=dev, generator=gen),)

    def example_batch(self, batch_size: int, **kwargs) -> tuple[tuple[torch.Tensor], torch.Tensor]:
        """(inputs, targets) with random data; targets fit `loss_fn`."""
        opts = self._options(batch_size, kwargs, allow=("num_classes",))
        dev, gen = opts["device"], opts["generator"]
        if self.task == "language_modelling":
            ids = torch.randint(0, opts["vocab_size"], (batch_size, opts["seq_len"] + 1), device=dev,
                                generator=gen)
            return (ids[:, :-1].contiguous(),), ids[:, 1:].contiguous()
        inputs = self.example_inputs(batch_size, **kwargs)
        targets = torch.randint(0, opts["num_classes"], (batch_size,), device=dev, generator=gen)
        return inputs, targets

    def loss_fn(self, output: torch.Tensor, batch) -> torch.Tensor:
        """Mean cross-entropy of `output` against the targets of `batch` = (inputs, targets)."""
        targets = batch[1] if isinstance(batch, (tuple, list)) else batch
        if self.task == "language_modelling":
            return F.cross_entropy(output.reshape(-1, output.size(-1)), targets.reshape(-1))
        return F.cross_entropy(output, targets)

    def _options(self, batch_size, kwargs: dict, allow=()) -> dict[str, Any]:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise SpecError(f"batch_size: got {batch_size!r} for model {self.name!r}; give an integer >= 1.")
        known = set(self.defaults) | {"device", "generator", *allow}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise SpecError(
                f"{self.name} inputs: unknown option(s) {unknown}; known: {sorted(known)}."
            )
        opts = {**self.defaults, "device": None, "generator": None, **kwargs}
        seq, max_pos = opts.get("seq_len"), opts.get("max_positions")
        if seq is not None and (not isinstance(seq, int) or seq < 1 or (max_pos and seq > max_pos)):
            raise SpecError(
                f"seq_len: got {seq!r} for {self.name}; give an integer in [1, {max_pos}] "
                "(the model's max_positions)."
            )
        return opts


def _entries() -> dict[str, ModelEntry]:
    img = {"image_size": 224, "num_classes": 1000}

    def bert(**cfg):
        return lambda **kw: tr.BertForSequenceClassification(**{**cfg, **kw})

    def gpt2(**cfg):
        return lambda **kw: tr.GPT2LMHeadModel(**{**cfg, **kw})

    bert_in = {"seq_len": 128, "vocab_size": 30522, "num_classes": 2, "max_positions": 512}
    gpt_in = {"seq_len": 512, "vocab_size": 50257, "max_positions": 1024}
    tiny_tok = {"seq_len": 32, "vocab_size": 1000, "max_positions": 128}
    rows = [
        ModelEntry("resnet18", cnn.resnet18, "classification", "image", "ResNet-18, ImageNet, 1.82 GMACs", img),
        ModelEntry("resnet50", cnn.resnet50, "classification", "image", "ResNet-50 v1.5, ImageNet, 4.1 GMACs", img),
        ModelEntry("vgg16", cnn.vgg16, "classification", "image", "VGG-16 (no BN), ImageNet, 15.5 GMACs", img),
        ModelEntry("vit-b16", tr.VisionTransformer, "classification", "image", "ViT-B/16 at 224, 17.6 GMACs", img),
        ModelEntry("bert-base", bert(), "classification", "tokens", "BERT-base + 2-label head, 110M params", bert_in),
        ModelEntry("bert-large", bert(hidden=1024, layers=24, heads=16, intermediate=4096),
                   "classification", "tokens", "BERT-large + 2-label head, 335M params", bert_in),
        ModelEntry("gpt2-small", gpt2(), "language_modelling", "tokens", "GPT-2 124M, tied LM head", gpt_in),
        ModelEntry("gpt2-medium", gpt2(hidden=1024, layers=24, heads=16), "language_modelling", "tokens",
                   "GPT-2 355M, tied LM head", gpt_in),
        ModelEntry("tiny-cnn", cnn.tiny_cnn, "classification", "signal",
                   "3 Conv1d + 1 Linear on MNIST-1D-sized (B, 1, 40) signals, 10 classes",
                   {"length": 40, "num_classes": 10}),
        ModelEntry("tiny-resnet", cnn.tiny_resnet, "classification", "image",
                   "CIFAR-sized ResNet (one BasicBlock per stage), 32x32, 10 classes",
                   {"image_size": 32, "num_classes": 10}),
        ModelEntry("tiny-bert", bert(vocab_size=1000, hidden=64, layers=2, heads=2, intermediate=256,
                                     max_positions=128), "classification", "tokens",
                   "2-layer BERT, hidden 64", {**tiny_tok, "num_classes": 2}),
        ModelEntry("tiny-gpt2", gpt2(vocab_size=1000, hidden=64, layers=2, heads=2, max_positions=128),
                   "language_modelling", "tokens", "2-layer GPT-2, hidden 64", tiny_tok),
    ]
    rows += zoo_hf.entries(ModelEntry)
    return {e.name: e for e in rows}


#: Every zoo model by name.
ZOO: dict[str, ModelEntry] = _entries()


def list_models() -> list[str]:
    return sorted(ZOO)


def get_entry(name: str) -> ModelEntry:
    """The zoo entry for `name`; SpecError with near matches when unknown."""
    if name in ZOO:
        return ZOO[name]
    near = difflib.get_close_matches(str(name), list_models(), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
    raise SpecError(
        f"model.name: unknown model {name!r}.{hint} Known models: {', '.join(list_models())}. "
        "For your own network give model.import: 'pkg.module:factory' instead."
    )


def build_model(name: str, **kwargs) -> nn.Module:
    """Build zoo model `name` with random weights; kwargs go to its factory (e.g. num_classes)."""
    entry = get_entry(name)
    try:
        return entry.factory(**kwargs)
    except TypeError as e:
        raise SpecError(f"model.kwargs: {kwargs!r} do not fit model {name!r}: {e}.") from e


def load_factory(path: str) -> Callable[..., nn.Module]:
    """Resolve 'pkg.module:factory' (the spec's model.import) to a callable that builds a module."""
    return resolve_callable(path, "model.import")
