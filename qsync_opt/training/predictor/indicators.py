"""The spec's indicator (`indicator.method`), computed on the job's model, weights and data, and cached.

auto:      the default: empirical on fp32-warmed-up weights with a `data:` section, else weight
           (indicator_auto.py); `solve` reads its cache only and says when it fell back.
weight:    weight quantisation noise (indicator.py), no data, not cached (instant).
gvar:      QSync's bi-directional indicator from calibration batches (gvar.py).
hessian:   Hutchinson trace × quantisation error (hessian.py).
empirical: measured loss change with one op lowered (empirical.py).

Calibration batches are the job's own training data (runtime/data.py), the first
`indicator.calibration.batches` batches. `model.checkpoint` loads trained weights first.
Results are cached under the cache directory (profile.cache_dir) by a key over the model
spec, a digest of the weights, the data settings, the method and the precisions.
"""

from __future__ import annotations

import hashlib
import json

import torch
from torch import nn

from qsync_opt.errors import SpecError
from qsync_opt.io import atomic_write_text, entry_lock
from qsync_opt.models.graph import OpGraph
from qsync_opt.precision import PRECISIONS
from qsync_opt.training.spec import JobSpec
from qsync_opt.training.predictor.calibration import calibration_batches  # noqa: F401 (re-exported)
from qsync_opt.training.predictor.sensitivity import Sensitivity
from qsync_opt.models.from_spec import build_from_spec, input_maker
from qsync_opt.models.private_rng import private_rng
from qsync_opt.models.tracing import TRACE_BATCH, trace
from qsync_opt.runtime.data import build_task
from qsync_opt.training.predictor.empirical import empirical_indicator
from qsync_opt.training.predictor import gvar  # called as gvar.gvar_indicator: tests wrap it in the module
from qsync_opt.training.predictor.hessian import hessian_indicator
from qsync_opt.training.predictor.indicator import weight_indicator
from qsync_opt.training.predictor.indicator_auto import compute_auto, resolved_method
from qsync_opt.training.predictor.profile import cache_dir

METHODS = ("auto", "weight", "gvar", "hessian", "empirical")


def load_checkpoint(spec: JobSpec, module: nn.Module) -> nn.Module:
    """Load `model.checkpoint` (a state_dict, or a dict holding one under 'model') into `module`."""
    path = spec.model.checkpoint
    if not path:
        return module
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise SpecError(f"model.checkpoint: {path!r} does not exist; give a torch.save'd state_dict") from None
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's input
        raise SpecError(f"model.checkpoint: cannot read {path!r} ({type(e).__name__}: {e}); "
                        "give a torch.save'd state_dict") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        raise SpecError(f"model.checkpoint: {path!r} does not fit model {spec.model.name or spec.model.import_!r}: "
                        f"{str(e).splitlines()[0]}") from None
    return module


def _weights_digest(module: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                 if t.numel() else b"")
    return h.hexdigest()[:16]


def cache_key(spec: JobSpec, module: nn.Module, precisions: tuple[str, ...]) -> str:
    model = spec.model.model_dump(mode="json", by_alias=True, exclude={"checkpoint"})
    data = {"seed": spec.training.seed, "seq_len": spec.training.seq_len,
            "calibration": spec.indicator.calibration.model_dump(mode="json"),
            "global_batch": spec.training.global_batch,
            "source": spec.data.model_dump(mode="json", by_alias=True) if spec.data is not None else None}
    blob = json.dumps({"model": model, "weights": _weights_digest(module), "data": data,
                       "method": spec.indicator.method, "precisions": list(precisions),
                       "backward": spec.runtime.backward_precision,
                       # empirical rev 2: functional GEMMs measured (rewritten as the trainer does), not set to 0
                       **({"rev": 2} if spec.indicator.method == "empirical" else {})}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def indicator_precisions(spec: JobSpec) -> tuple[str, ...]:
    """Every format: one indicator serves any cluster (empirical: the cluster's formats only, it is costly)."""

    if resolved_method(spec) != "empirical":
        return PRECISIONS
    used = {p for g in spec.cluster.groups for p in g.allowed_precisions} | {"fp32"}
    return tuple(p for p in PRECISIONS if p in used)


def compute_indicator(spec: JobSpec, module: nn.Module | None = None, graph: OpGraph | None = None,
                      *, use_cache: bool = True, log=None, compute: bool = True,
                      progress: bool = False) -> tuple[Sensitivity, str]:
    """(Sensitivity, one-line note) of the spec's indicator method, from the cache when it is there.

    method 'auto' (indicator_auto.py): `compute` False reads its cache only (what `solve` does) and
    falls back to 'weight' with a note saying how to get the better one; `progress` shows its warm-up."""

    method = spec.indicator.method
    if module is None or graph is None:

        with private_rng(spec.training.seed):  # never torch's global RNG
            module = build_from_spec(spec)
        inputs = input_maker(spec)(TRACE_BATCH, torch.Generator().manual_seed(0))
        graph = trace(module, inputs, model_name=spec.model.name or spec.model.import_,
                      leaf_modules=spec.model.leaf_modules)
    module = load_checkpoint(spec, module)
    ps = indicator_precisions(spec)
    if method == "auto":
        return compute_auto(spec, module, graph, base_key=lambda p: cache_key(spec, module, p),
                            cache_path=lambda kind, key: cache_dir() / "indicators" / f"{kind}-{key}.json",
                            precisions=ps, use_cache=use_cache, compute=compute, log=log, progress=progress)
    if method == "weight":
        return weight_indicator(module, graph, ps), "indicator: weight (weight quantisation noise, no data)"
    path = cache_dir() / "indicators" / f"{method}-{cache_key(spec, module, ps)}.json"
    if not use_cache:
        return _compute(spec, module, graph, ps, path, False, log)
    if (sens := _read_cached(path)) is not None:
        return sens, f"indicator: {method} (cached {path})"
    # one process (or thread) computes an entry, the others wait for it and read it (io.entry_lock)
    with entry_lock(path, on_wait=lambda: log and log(f"waiting: another process is computing {path}")):
        if (sens := _read_cached(path)) is not None:
            return sens, f"indicator: {method} (cached {path}, computed by another process meanwhile)"
        return _compute(spec, module, graph, ps, path, True, log)


def _read_cached(path) -> Sensitivity | None:
    """The entry at `path`; None if absent or damaged (then it is recomputed). Entries are
    written atomically, so a reader never sees half of one."""
    try:
        return Sensitivity.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _compute(spec: JobSpec, module: nn.Module, graph: OpGraph, ps: tuple[str, ...], path, use_cache: bool,
             log) -> tuple[Sensitivity, str]:
    method = spec.indicator.method
    if log:
        log(f"computing the {method} indicator from {spec.indicator.calibration.batches} calibration batches")

    task = build_task(spec)
    batches = calibration_batches(spec, task)
    loss = task.loss  # the job's own training loss
    bwd = spec.runtime.backward_precision
    if method == "gvar":
        sens = gvar.gvar_indicator(module, graph, batches, lambda out, batch: loss(out, batch[1]), ps,
                              backward_precision=bwd)
    elif method == "hessian":
        sens = hessian_indicator(_train_copy(module), graph, batches, loss, ps)
    elif method == "empirical":
        sens = empirical_indicator(module, graph, batches, loss, ps, backward_precision=bwd,
                                   leaf_modules=spec.model.leaf_modules)
    else:
        raise SpecError(f"indicator.method: {method!r} is not known; use one of {', '.join(METHODS)}")
    if use_cache:
        atomic_write_text(path, json.dumps(sens.to_dict()))
    return sens, f"indicator: {method} ({len(batches)} calibration batches; cached {path})"


def _train_copy(module: nn.Module) -> nn.Module:
    import copy

    m = copy.deepcopy(module).float()
    return m.eval()  # eval: BatchNorm uses its running statistics, so the loss is a function of W alone

