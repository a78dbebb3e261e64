"""`indicator.method: auto`, the default: the data-driven indicator where the job has data.

Why this one: on V100+T4 (CNN, MNIST-1D, docs/accuracy.md, benchmarks/results/accuracy.csv)
the plan made with `weight` on random initial weights recovered 13% of the weak network's
fp32 - uniform-int4 gap; the same planner with `empirical` on weights trained in fp32 for 400
steps recovered 59%. Random weights say little about which operator matters.

- With a `data:` section: `empirical` (the loss change with one op lowered, empirical.py) on
  the model's weights after `indicator.warmup_steps` fp32 training steps on the job's own data
  (model.checkpoint's weights instead, when given: already trained, no warm-up). Computed once
  by `qsync-opt indicate` or `qsync-opt run` (a progress bar over the warm-up), cached by model,
  initial weights, data, calibration, precisions and steps. `solve` reads the cache; when it is
  not there, `solve` does not train for minutes on its own: it falls back to `weight` and says
  so, and how to get the better one.
- Without data: `weight`, and the note says whether the weights were random.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable

import torch
from torch import nn

from qsync_opt.io import atomic_write_text
from qsync_opt.models.graph import OpGraph
from qsync_opt.precision import PRECISIONS
from qsync_opt.training.spec import JobSpec
from qsync_opt.training.predictor.measuring import ProgressBar
from qsync_opt.training.predictor.sensitivity import Sensitivity
from qsync_opt.data.task import build_task
from qsync_opt.training.predictor.calibration import calibration_batches
from qsync_opt.training.predictor.empirical import empirical_indicator
from qsync_opt.training.predictor.indicator import weight_indicator
from qsync_opt.training.runtime.trainer import make_optimizer

WARMUP_BATCH = 64
"""Samples per warm-up step (the accuracy runs' fp32 checkpoints used 64), at most global_batch."""


def resolved_method(spec: JobSpec) -> str:
    """The method `auto` stands for in this spec (other methods stand for themselves)."""
    m = spec.indicator.method
    if m != "auto":
        return m
    return "empirical" if spec.data is not None else "weight"


def weights_words(spec: JobSpec) -> str:
    return f"the weights of model.checkpoint {spec.model.checkpoint}" if spec.model.checkpoint else "random initial weights"


def auto_key(spec: JobSpec, base_key: str) -> str:
    """Cache key: the indicator's own (model, initial weights, data, calibration, precisions) and the warm-up."""
    steps = 0 if spec.model.checkpoint else spec.indicator.warmup_steps
    blob = json.dumps({"base": base_key, "warmup_steps": steps, "warmup_batch": _warmup_batch(spec),
                       "optimizer": spec.training.optimizer, "lr": spec.training.lr}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _warmup_batch(spec: JobSpec) -> int:
    return min(spec.training.global_batch, WARMUP_BATCH)


def warm_up(spec: JobSpec, module: nn.Module, task, *, progress: bool = True, log: Callable | None = None) -> nn.Module:
    """A copy of `module` trained in fp32 for indicator.warmup_steps steps on the job's training data
    (the spec's optimizer and lr, `WARMUP_BATCH` samples a step, in order from the data's start)."""

    steps = spec.indicator.warmup_steps
    net = copy.deepcopy(module).float().train()
    if steps == 0:
        return net.eval()
    torch.manual_seed(spec.training.seed)
    opt = make_optimizer(spec.training, net.parameters())
    size = _warmup_batch(spec)
    bar = ProgressBar(progress, f"indicator warm-up: {steps} fp32 steps", steps)
    try:
        for step in range(steps):
            inputs, targets = task.samples(step * size, size)
            inputs = inputs if isinstance(inputs, tuple) else (inputs,)
            loss = task.loss(net(*inputs), targets)
            opt.zero_grad()
            loss.backward()
            opt.step()
            bar.advance()
    finally:
        bar.close()
    if log:
        log(f"warm-up: {steps} fp32 steps of {size} samples, last loss {float(loss.detach()):.4f}")
    return net.eval()


def compute_auto(spec: JobSpec, module: nn.Module, graph: OpGraph, *, base_key: Callable[[tuple], str],
                 cache_path: Callable[[str, str], "object"], precisions: tuple[str, ...], use_cache: bool,
                 compute: bool, log: Callable | None, progress: bool) -> tuple[Sensitivity, str]:
    """(Sensitivity, note) for method 'auto' (module docstring). `module` holds the initial (or
    checkpoint) weights; `compute` False reads the cache only and falls back to 'weight'."""

    if spec.data is None:
        return (weight_indicator(module, graph, PRECISIONS),
                f"indicator: weight on {weights_words(spec)} (auto: no data section, so no data-driven "
                "indicator; add `data:` for the empirical one)")
    steps = 0 if spec.model.checkpoint else spec.indicator.warmup_steps
    on = (f"the weights of model.checkpoint {spec.model.checkpoint}" if spec.model.checkpoint
          else f"weights trained {steps} fp32 steps on the job's data" if steps else "random initial weights")
    path = cache_path("auto-empirical", auto_key(spec, base_key(precisions)))
    if use_cache and path.exists():
        try:
            sens = Sensitivity.from_dict(json.loads(path.read_text()))
            return sens, f"indicator: empirical on {on} (auto; cached {path})"
        except (ValueError, KeyError, TypeError):
            pass  # a damaged entry is recomputed (or, for solve, fallen back from)
    if not compute:
        return (weight_indicator(module, graph, PRECISIONS),  # as method: weight computes it
                f"indicator: weight on {weights_words(spec)}: fell back, the auto indicator (empirical on {on}) "
                f"is not in the cache; run `qsync-opt indicate SPEC` (or `qsync-opt run`) once to compute it, "
                "then solve again")

    task = build_task(spec)
    net = warm_up(spec, module, task, progress=progress, log=log) if steps else copy.deepcopy(module).float().eval()
    if log:
        log(f"computing the empirical indicator from {spec.indicator.calibration.batches} calibration batches")
    batches = calibration_batches(spec, task)
    sens = empirical_indicator(net, graph, batches, task.loss, precisions,
                               backward_precision=spec.runtime.backward_precision)
    if use_cache:
        atomic_write_text(path, json.dumps(sens.to_dict()))
    return sens, f"indicator: empirical on {on} (auto; {len(batches)} calibration batches; cached {path})"
