"""`model.output`: train a model whose forward returns a ModelOutput, a dict or a tuple, without a wrapper.

Hugging Face models return a `ModelOutput` (`out.logits`), many others a dict or a tuple. The
loss, the evaluation and the indicator's calibration all want the one tensor of logits, so
`select_output(module, "logits")` changes the module's class to a subclass whose forward
returns `out["logits"]` (an int picks a tuple element). Nothing else changes: every submodule
keeps its FQN, the parameters are the same objects, `isinstance(module, OriginalClass)` holds
and the class keeps its name, so plans, leaf_modules and fingerprints read the same.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from torch import nn

from qsync_opt.errors import ModelError

OutputKey = "str | int"


def pick(out, key, model_name: str = "model"):
    """`out[key]` for a mapping or sequence, else `getattr(out, key)`; a ModelError naming what there is."""
    try:
        if isinstance(key, int):
            if isinstance(out, Mapping):
                return list(out.values())[key]
            return out[key]
        if isinstance(out, Mapping):
            return out[key]
        return getattr(out, key)
    except (KeyError, IndexError, AttributeError, TypeError):
        have = (f"keys {', '.join(map(repr, out.keys()))}" if isinstance(out, Mapping)
                else f"{len(out)} elements" if isinstance(out, (tuple, list)) else "no such attribute")
        raise ModelError(f"model.output: {key!r} is not in what {model_name!r} returns "
                         f"({type(out).__name__} with {have}); name one of those") from None


@functools.cache
def _selecting_class(cls: type, key) -> type:
    original = cls.forward

    def forward(self, *args, **kwargs):
        return pick(original(self, *args, **kwargs), key, cls.__name__)

    return type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "_qsync_output": key})


def select_output(module: nn.Module, key) -> nn.Module:
    """`module`, in place, returning `key` of its forward's output (see the module docstring)."""
    if key is None:
        return module
    if getattr(type(module), "_qsync_output", None) is not None:  # already selecting: select on its base
        module.__class__ = type(module).__mro__[1]
    module.__class__ = _selecting_class(type(module), key)
    return module
