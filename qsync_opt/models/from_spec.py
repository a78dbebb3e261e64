"""The spec's model section -> a module and inputs that fit it.

One place decides how `model.name` / `model.import` / `model.kwargs` / `training.seq_len`
become an nn.Module and example inputs, so the planner traces exactly what the runtime trains.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from qsync_opt.errors import ModelError, QSyncError, SpecError
from qsync_opt.models import zoo_hf
from qsync_opt.models.output_select import select_output
from qsync_opt.models.spec import ModelJob
from qsync_opt.models.zoo import build_model, get_entry, load_factory

InputMaker = Callable[[int, "torch.Generator | None"], tuple[torch.Tensor, ...]]


def build_from_spec(spec: ModelJob) -> nn.Module:
    """The spec's model with random weights (seed torch first for reproducibility).

    A zoo model whose constructor fails on the spec's `model.kwargs` (`num_labels: -7`: a tensor of
    negative size) is a SpecError naming model.kwargs and the constructor's message, not a traceback."""
    if spec.model.name is not None:
        try:
            module = build_model(spec.model.name, **spec.model.kwargs)
        except QSyncError:
            raise
        except Exception as e:  # noqa: BLE001 - the constructor's own check of the values it was given
            if spec.model.kwargs:
                raise SpecError(f"model.kwargs: model {spec.model.name!r} cannot be built with {spec.model.kwargs!r}: "
                                f"{type(e).__name__}: {e}; fix the values in model.kwargs") from None
            raise ModelError(f"model.name: building {spec.model.name!r} raised {type(e).__name__}: {e}") from None
        return select_output(module, spec.model.output)
    try:
        factory = load_factory(spec.model.import_)
    except QSyncError:
        raise
    except Exception as e:  # the user's module failed while importing: their code, our message
        raise ModelError(f"model.import: importing {spec.model.import_!r} raised {type(e).__name__}: {e}; "
                         "fix that module (run `python -c 'import <module>'` to see the full traceback)") from None
    try:
        module = factory(**spec.model.kwargs)
    except TypeError as e:
        raise SpecError(f"model.kwargs: {spec.model.kwargs!r} do not fit {spec.model.import_!r}: {e}") from e
    except QSyncError:
        raise
    except Exception as e:
        given = f" with model.kwargs {spec.model.kwargs!r}" if spec.model.kwargs else ""
        raise ModelError(f"model.import: factory {spec.model.import_!r} raised {type(e).__name__}{given}: {e}; "
                         "fix the factory or model.kwargs (call it in Python to see the full traceback)") from None
    if not isinstance(module, nn.Module):
        raise SpecError(f"model.import: {spec.model.import_!r} returned a {type(module).__name__}, not an nn.Module")
    return select_output(module, spec.model.output)


def warm_imports(spec: ModelJob) -> None:
    """Import the modules `build_from_spec(spec)` will import, without building anything (errors are
    left for the build itself to report)."""
    try:
        if spec.model.name is not None:
            if spec.model.name in zoo_hf.SPECS:
                zoo_hf.warm_imports(spec.model.name)
        else:
            load_factory(spec.model.import_)
    except Exception:  # noqa: BLE001 - the build raises it again, with its message
        pass


def input_maker(spec: ModelJob) -> InputMaker:
    """`make(batch, generator) -> forward args` for the spec's model."""
    if spec.model.name is not None:
        entry = get_entry(spec.model.name)
        opts = {}
        if spec.training and spec.training.seq_len and "seq_len" in entry.defaults:
            opts["seq_len"] = spec.training.seq_len
        for key in ("vocab_size",):  # keep token ids in range when kwargs resize the model
            if key in spec.model.kwargs and key in entry.defaults:
                opts[key] = _positive_int(spec.model.kwargs[key], f"model.kwargs.{key}")
        return lambda n, g=None: entry.example_inputs(n, generator=g, **opts)
    shape = tuple(spec.model.input_shape)
    if spec.model.input_dtype == "int64":
        vocab = spec.model.kwargs.get("vocab_size")
        if isinstance(vocab, int) and not isinstance(vocab, bool):
            vocab = _positive_int(vocab, "model.kwargs.vocab_size")
        else:
            raise SpecError(
                f"model.kwargs.vocab_size: got {vocab!r}; an imported model with int64 inputs needs the "
                "vocabulary size to draw token ids (add vocab_size to model.kwargs)"
            )
        return lambda n, g=None: (torch.randint(0, vocab, (n, *shape), generator=g),)
    return lambda n, g=None: (torch.randn((n, *shape), generator=g),)


def _positive_int(value, field: str) -> int:
    """`value` when it is an integer >= 1 (a vocabulary size token ids are drawn below); else SpecError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{field}: got {value!r}; give a positive integer (token ids are drawn from 0 to {field.split('.')[-1]} - 1)")
    return value
