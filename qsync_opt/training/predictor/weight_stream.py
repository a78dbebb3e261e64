"""The weight indicator without the model's weights in memory.

`prepare_light(spec, seed)` builds the spec's model on the meta device with its init recorded
(models/lazy_weights.py) and swaps its tensors for zero-stride placeholders; the pipeline
traces that module on the usual inputs (shapes only), and
`streamed_weight_indicator` replays the init one tensor at a time to read each selectable
op's weight statistics, the same bits a real build gives. None from either means "not here":
the caller builds the model for real, as before (a checkpoint to load, an init that does
nothing on meta, a model whose forward needs real values, ...).
"""

from __future__ import annotations

from torch import nn

from qsync_opt.models.graph import OpGraph
import torch

from qsync_opt.models.lazy_weights import Recording, build_recorded, zero_stride_twin
from qsync_opt.training.spec import JobSpec
from qsync_opt.training.predictor.indicator import _weight_of, weight_indicator, weight_stats
from qsync_opt.training.predictor.sensitivity import Sensitivity


def light_capable(spec: JobSpec) -> bool:
    """Only the weight indicator, from random weights, needs no more than shapes and one tensor at a time."""
    method = spec.indicator.method
    return (method == "weight" or (method == "auto" and spec.data is None)) and not spec.model.checkpoint


def prepare_light(spec: JobSpec, seed: int) -> tuple[nn.Module, Recording, dict] | None:
    """(module with placeholder weights, its recorded init, {id(placeholder): meta tensor}), or
    None when the build cannot run on meta."""
    from qsync_opt.models.from_spec import build_from_spec

    try:
        module, rec = build_recorded(lambda: build_from_spec(spec), seed)
    except Exception:  # noqa: BLE001 - e.g. a factory reading values (.item()) at build time: build for real
        return None
    if rec.refused or any(p.device.type != "meta" for p in module.parameters()):
        return None
    return module, rec, zero_stride_twin(module)


def streamed_weight_indicator(module: nn.Module, graph: OpGraph, rec: Recording, precisions: tuple[str, ...],
                              meta_of: dict[int, "torch.Tensor"]) -> Sensitivity | None:
    """weight_indicator(module, graph, precisions) of the recorded build, or None if it cannot be
    replayed exactly. `module` holds placeholders; `meta_of` maps them to the recorded tensors."""
    wanted = {}
    for node in graph.selectable:
        w = _weight_of(module, node)
        if w is not None:
            if id(w) not in meta_of:
                return None
            wanted[node.name] = meta_of[id(w)]
    got = rec.tensor_stats(wanted, weight_stats)
    if got is None:
        return None
    return weight_indicator(module, graph, precisions, stats=lambda node: got[node.name])
