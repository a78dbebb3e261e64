"""A decoder-only transformer's shape, by preset name and/or fields, for the LLM cost model.

No weights are needed to plan: the cost model (`qsync_opt.llm.costs`) reads only these shape
fields. Presets give the published configs (the models' config.json on their model cards) of
the models LLM-PQ (PPoPP'24) evaluates; any field given overrides the preset's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from qsync_opt.spec.base import SpecModel as _Model


#: Published configs (the models' config.json on their model cards).
PRESETS: dict[str, dict] = {
    "opt-13b": dict(layers=40, hidden=5120, ffn=20480, heads=40, kv_heads=40, vocab=50272, max_positions=2048,
                    ffn_matrices=2, tied_embeddings=True, learned_positions=True),
    "opt-30b": dict(layers=48, hidden=7168, ffn=28672, heads=56, kv_heads=56, vocab=50272, max_positions=2048,
                    ffn_matrices=2, tied_embeddings=True, learned_positions=True),
    "opt-66b": dict(layers=64, hidden=9216, ffn=36864, heads=72, kv_heads=72, vocab=50272, max_positions=2048,
                    ffn_matrices=2, tied_embeddings=True, learned_positions=True),
    "bloom-176b": dict(layers=70, hidden=14336, ffn=57344, heads=112, kv_heads=112, vocab=250880, max_positions=2048,
                       ffn_matrices=2, tied_embeddings=True, learned_positions=False),
    "llama-2-7b": dict(layers=32, hidden=4096, ffn=11008, heads=32, kv_heads=32, vocab=32000, max_positions=4096,
                       ffn_matrices=3, tied_embeddings=False, learned_positions=False),
    "llama-2-13b": dict(layers=40, hidden=5120, ffn=13824, heads=40, kv_heads=40, vocab=32000, max_positions=4096,
                        ffn_matrices=3, tied_embeddings=False, learned_positions=False),
    "llama-2-70b": dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=32000, max_positions=4096,
                        ffn_matrices=3, tied_embeddings=False, learned_positions=False),
    "llama-3-8b": dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256, max_positions=8192,
                       ffn_matrices=3, tied_embeddings=False, learned_positions=False),
    "llama-3-70b": dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256, max_positions=8192,
                        ffn_matrices=3, tied_embeddings=False, learned_positions=False),
}

BitWidth = Literal[2, 3, 4, 8, 16]


class TransformerConfig(_Model):
    """A decoder-only transformer: a preset name, and/or its shape fields (fields override the preset)."""

    preset: str | None = None
    """One of opt-13b, opt-30b, opt-66b, bloom-176b, llama-2-7b/13b/70b, llama-3-8b/70b."""
    layers: int | None = Field(default=None, ge=1)
    """Number of decoder layers."""
    hidden: int | None = Field(default=None, ge=1)
    """Hidden size h."""
    ffn: int | None = Field(default=None, ge=1)
    """FFN inner size."""
    heads: int | None = Field(default=None, ge=1)
    """Attention (query) heads."""
    kv_heads: int | None = Field(default=None, ge=1)
    """Key/value heads (fewer than heads for grouped-query attention); default: heads."""
    vocab: int | None = Field(default=None, ge=1)
    max_positions: int | None = Field(default=None, ge=1)
    """Longest context the model accepts (prompt + generated tokens must fit)."""
    ffn_matrices: Literal[2, 3] | None = None
    """2 for a plain MLP (OPT, BLOOM), 3 for a gated one (Llama's gate/up/down)."""
    tied_embeddings: bool | None = None
    """Whether the LM head shares the token embedding's weights."""
    learned_positions: bool | None = None
    """Whether there is a learned position-embedding table (OPT)."""

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v):
        if v is not None and v.lower() not in PRESETS:
            raise ValueError(f"unknown preset {v!r}; presets: {', '.join(PRESETS)}; or give the shape fields")
        return v.lower() if v else v

    @model_validator(mode="after")
    def _complete(self) -> "TransformerConfig":
        base = PRESETS.get(self.preset or "", {})
        missing = [k for k in ("layers", "hidden", "ffn", "heads", "vocab") if getattr(self, k) is None and k not in base]
        if missing:
            raise ValueError(f"model needs {missing} (or a preset: {', '.join(PRESETS)})")
        hidden, heads, kv_heads = self.get("hidden"), self.get("heads"), self.get("kv_heads")
        if hidden % heads:  # each head is hidden / heads wide: a fraction (or 0, heads > hidden) is no model
            raise ValueError(f"heads: {heads} does not divide hidden {hidden} (each head is hidden / heads wide); "
                             "give a divisor of hidden")
        if kv_heads > heads or heads % kv_heads:
            raise ValueError(f"kv_heads: {kv_heads} must divide heads {heads} (each key/value head serves "
                             "heads / kv_heads query heads)")
        return self

    def get(self, key: str):
        """The field, else the preset's value, else its default."""
        v = getattr(self, key)
        if v is not None:
            return v
        base = PRESETS.get(self.preset or "", {})
        if key in base:
            return base[key]
        defaults = {"kv_heads": self.get("heads"), "max_positions": 2048, "ffn_matrices": 2,
                    "tied_embeddings": True, "learned_positions": False}
        return defaults[key]

    @property
    def head_dim(self) -> int:
        return self.get("hidden") // self.get("heads")

    @property
    def label(self) -> str:
        return self.preset or f"custom-{self.get('layers')}x{self.get('hidden')}"
