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

from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from torch import nn

from qsync_opt.models.graph import OpGraph
import torch

from qsync_opt.models.lazy_weights import Recording, build_recorded, meta_parameter_bytes, zero_stride_twin
from qsync_opt.training.spec import JobSpec
from qsync_opt.training.predictor.indicator import weight_of, weight_indicator, weight_stats
from qsync_opt.training.predictor.sensitivity import Sensitivity
from qsync_opt.models.from_spec import build_from_spec, warm_imports


LIGHT_MIN_BYTES = 256 << 20
"""Models whose parameters take less are built for real: recording a meta build and replaying its
init costs more time than a real build of a small model (ResNet-50 has 102 MB), and its weights
are small to hold; from BERT-base (440 MB) up, streaming holds a few tensors
instead of all of them in about the same time."""


def light_capable(spec: JobSpec) -> bool:
    """Only the weight indicator, from random weights, needs no more than shapes and one tensor at a
    time; and only a model of LIGHT_MIN_BYTES or more is worth streaming."""
    method = spec.indicator.method
    if not ((method == "weight" or (method == "auto" and spec.data is None)) and not spec.model.checkpoint):
        return False
    return LIGHT_MIN_BYTES <= 0 or _parameter_bytes(spec) >= LIGHT_MIN_BYTES


def _parameter_bytes(spec: JobSpec) -> float:
    """The model's parameter bytes from a plain meta build (no weights, no recording: milliseconds);
    infinity where that build fails, so prepare_light decides (it refuses what it cannot replay)."""

    try:
        return float(meta_parameter_bytes(lambda: build_from_spec(spec)))
    except Exception:  # noqa: BLE001 - e.g. a factory reading values at build time
        return float("inf")


class LightBuild(NamedTuple):
    """A model built on the meta device, ready to trace and to replay its init one tensor at a time."""

    module: nn.Module
    """The model, its parameters zero-stride placeholders."""
    recording: Recording
    """Its recorded init."""
    meta_of: dict[int, torch.Tensor]
    """id(placeholder) -> the recorded meta tensor."""


def prepare_light(spec: JobSpec, seed: int) -> LightBuild | None:
    """The spec's model built on meta with its init recorded, or None when the build cannot run on meta."""

    try:
        module, rec = build_recorded(lambda: build_from_spec(spec), seed, warm=lambda: warm_imports(spec))
    except Exception:  # noqa: BLE001 - e.g. a factory reading values (.item()) at build time: build for real
        return None
    if rec.refused or any(p.device.type != "meta" for p in module.parameters()):
        return None
    return LightBuild(module, rec, zero_stride_twin(module))


def start_weight_stats(module: nn.Module, rec: Recording, meta_of: dict[int, "torch.Tensor"]) -> "Future":
    """Replay the recorded init on a worker thread, reading weight_stats of every parameter, while
    the caller traces (the replay is torch kernels that release the GIL; the trace is Python).
    The result: {id(placeholder): stats}, or None where the replay cannot be exact."""
    named = {name: meta_of[id(p)] for name, p in module.named_parameters() if id(p) in meta_of}
    ids = {name: id(p) for name, p in module.named_parameters() if id(p) in meta_of}

    def run():
        got = rec.tensor_stats(named, weight_stats)
        return None if got is None else {ids[name]: st for name, st in got.items()}

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qsync-weight-stats")
    try:
        return pool.submit(run)
    finally:
        pool.shutdown(wait=False)


def streamed_weight_indicator(module: nn.Module, graph: OpGraph, rec: Recording, precisions: tuple[str, ...],
                              meta_of: dict[int, "torch.Tensor"], stats: "Future | None" = None) -> Sensitivity | None:
    """weight_indicator(module, graph, precisions) of the recorded build, or None if it cannot be
    replayed exactly. `module` holds placeholders; `meta_of` maps them to the recorded tensors;
    `stats`, from start_weight_stats, holds the replay already under way."""
    weights = {}  # selectable op -> its placeholder weight
    for node in graph.selectable:
        w = weight_of(module, node)
        if w is not None:
            if id(w) not in meta_of:
                return None
            weights[node.name] = w
    if stats is not None:  # every parameter's stats, replayed beside the trace
        by_id = stats.result()
        got = None if by_id is None else {name: by_id.get(id(w)) for name, w in weights.items()}
        if got is not None and None in got.values():
            return None
    else:
        got = rec.tensor_stats({name: meta_of[id(w)] for name, w in weights.items()}, weight_stats)
    if got is None:
        return None
    return weight_indicator(module, graph, precisions, stats=lambda node: got[node.name])
