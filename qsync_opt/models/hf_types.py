"""Hugging Face `transformers` module types the planner and runtime must know, found without importing it.

A model holding one of them has imported transformers already, so the types are looked up in
`sys.modules`; code that never sees a transformers model never pays for importing it.
"""

from __future__ import annotations

import sys

from torch import nn


def hf_conv1d_type() -> type | None:
    """transformers' `Conv1D` (GPT-2's linear layer: y = x @ W + b with W stored (in, out)), if loaded."""
    mod = sys.modules.get("transformers.pytorch_utils")
    return getattr(mod, "Conv1D", None) if mod is not None else None


def is_hf_conv1d(m: "nn.Module | type") -> bool:
    cls = hf_conv1d_type()
    return cls is not None and (m is cls if isinstance(m, type) else type(m) is cls)
