"""The transformers-built zoo entries: what they build, and the error when transformers is missing."""

from __future__ import annotations

import sys

import pytest

from qsync_opt.errors import SpecError
from qsync_opt.models import ZOO, build_model


def test_without_transformers_the_entry_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(SpecError, match=r"model\.name 'hf-tiny-llama' needs the 'transformers' package.*qsync-opt\[hf\]"):
        build_model("hf-tiny-llama")


def test_llama_entry_has_gqa_rope_and_a_gated_mlp():
    T = pytest.importorskip("transformers")
    import torch

    m = build_model("hf-tiny-llama", num_hidden_layers=1)
    assert isinstance(m, T.LlamaForCausalLM) and m.config.num_key_value_heads < m.config.num_attention_heads
    layer = m.model.layers[0]
    assert {"gate_proj", "up_proj", "down_proj"} <= {n for n, _ in layer.mlp.named_children()}
    assert m.config.rope_parameters is not None or getattr(m.config, "rope_theta", None)
    ids = ZOO["hf-tiny-llama"].example_inputs(2, seq_len=8)[0]
    assert m(ids).shape == (2, 8, 1000) and isinstance(m(ids), torch.Tensor)  # logits, not a ModelOutput
