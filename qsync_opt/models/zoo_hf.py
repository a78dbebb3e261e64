"""Zoo entries built by Hugging Face `transformers` from a config (random weights, nothing downloaded).

BERT, GPT-2 and a Llama-style decoder (grouped-query attention, rotary positions, gated SiLU
MLP, RMSNorm) at the published sizes and at tiny test sizes, beside the hand-written models of
zoo_transformer.py. They are what `transformers` builds, so they run its real code: fused
`F.scaled_dot_product_attention`, GPT-2's `Conv1D`, shape-dependent control flow, which symbolic
fx cannot follow and models/export_trace.py captures with torch.export.

Each returns the logits tensor (its forward's `ModelOutput.logits`, models/output_select.py),
like every zoo model, with `use_cache=False` (training). `kwargs` are config fields
(`hidden_size`, `num_hidden_layers`, `vocab_size`, `num_labels`, `attn_implementation`, ...).
transformers is the optional extra `hf`; without it these entries say what to install.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from qsync_opt.errors import SpecError
from qsync_opt.models.output_select import select_output

#: name -> (transformers model class, config class, config defaults, zoo task, description, input defaults)
_BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                  vocab_size=30522, max_position_embeddings=512, num_labels=2)
_TINY_BERT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
                  vocab_size=1000, max_position_embeddings=128, num_labels=2)
_GPT2_SMALL = dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024)
_TINY_GPT2 = dict(n_embd=64, n_layer=2, n_head=2, vocab_size=1000, n_positions=128, bos_token_id=0, eos_token_id=0)
_LLAMA_SMALL = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                    intermediate_size=2048, vocab_size=32000, max_position_embeddings=2048)
_TINY_LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=128, vocab_size=1000, max_position_embeddings=128)

SPECS: dict[str, tuple[str, str, dict, str, str, dict]] = {
    "hf-bert-base": ("BertForSequenceClassification", "BertConfig", _BERT_BASE, "classification",
                     "transformers BERT-base + 2-label head, 110M params", {"seq_len": 128, "vocab_size": 30522,
                                                                           "num_classes": 2, "max_positions": 512}),
    "hf-tiny-bert": ("BertForSequenceClassification", "BertConfig", _TINY_BERT, "classification",
                     "transformers 2-layer BERT, hidden 64", {"seq_len": 32, "vocab_size": 1000, "num_classes": 2,
                                                              "max_positions": 128}),
    "hf-gpt2-small": ("GPT2LMHeadModel", "GPT2Config", _GPT2_SMALL, "language_modelling",
                      "transformers GPT-2 124M, tied LM head (Conv1D layers)", {"seq_len": 512, "vocab_size": 50257,
                                                                                 "max_positions": 1024}),
    "hf-tiny-gpt2": ("GPT2LMHeadModel", "GPT2Config", _TINY_GPT2, "language_modelling",
                     "transformers 2-layer GPT-2, hidden 64", {"seq_len": 32, "vocab_size": 1000, "max_positions": 128}),
    "hf-llama-small": ("LlamaForCausalLM", "LlamaConfig", _LLAMA_SMALL, "language_modelling",
                       "transformers Llama-style 12 layers, hidden 768, GQA 12/4 heads, RoPE, gated MLP",
                       {"seq_len": 512, "vocab_size": 32000, "max_positions": 2048}),
    "hf-tiny-llama": ("LlamaForCausalLM", "LlamaConfig", _TINY_LLAMA, "language_modelling",
                      "transformers 2-layer Llama-style, hidden 64, GQA 4/2 heads", {"seq_len": 32, "vocab_size": 1000,
                                                                                    "max_positions": 128}),
}


def need_transformers(what: str):
    try:
        import transformers
    except ImportError as e:
        raise SpecError(f"{what} needs the 'transformers' package, which is not installed ({e}); install it with "
                        "pip install 'qsync-opt[hf]' (or pip install transformers)") from None
    return transformers


def build_hf(name: str, **kwargs: Any) -> nn.Module:
    """Zoo model `name` (a key of SPECS) with random weights, returning logits."""
    model_cls, config_cls, defaults, *_ = SPECS[name]
    T = need_transformers(f"model.name {name!r}")
    attn = kwargs.pop("attn_implementation", "sdpa")
    cfg = getattr(T, config_cls)(**{**defaults, "use_cache": False, **kwargs})
    cfg._attn_implementation = attn
    model = getattr(T, model_cls)(cfg)
    return select_output(model, "logits")


def warm_imports(name: str) -> None:
    """Import what `build_hf(name)` imports (transformers loads a model's modules lazily, on first
    attribute access): a build watched by a profiler (models/lazy_weights.build_recorded) then runs
    only the constructor's calls under the watch, not seconds of module imports."""
    model_cls, config_cls, *_ = SPECS[name]
    T = need_transformers(f"model.name {name!r}")
    getattr(T, config_cls), getattr(T, model_cls)


def entries(entry_cls) -> list:
    """The ModelEntry rows for zoo.py."""
    return [entry_cls(name, _factory(name), task, "tokens", desc, dict(inputs))
            for name, (_, _, _, task, desc, inputs) in SPECS.items()]


def _factory(name: str):
    def factory(**kwargs):
        return build_hf(name, **kwargs)

    factory.__name__ = name.replace("-", "_")
    return factory
