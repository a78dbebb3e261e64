"""Whole training steps of the runtime, timed by the profiler beside its isolated ops
(and the two other whole-model figures it needs: the optimizer step with the loss, and casts).

An op timed alone misses what a real step pays around it: autograd graph bookkeeping and
Python dispatch per op, zero_grad, the allocator, and backward kernels running on
activations that are no longer hot in cache. Summing isolated ops under-predicts the step,
and by a different amount per precision (the quantized modules dispatch more small ops).
So the profiler also times, with the same estimator, one whole step per precision of the
very model it profiled: every selectable op at that precision (runtime.apply_plan), the
spec's optimizer, zero_grad + forward + loss + backward + step — what a trainer runs. The
cost model (profile_costs.py) turns the difference between these and its own op sums into
a per-step term and a per-op term per precision.
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from qsync_opt.models.graph import OpGraph
from qsync_opt.training.predictor.profile import step_key
from qsync_opt.data.task import build_task
from qsync_opt.models.from_spec import build_from_spec
from qsync_opt.runtime.apply import apply_plan
from qsync_opt.runtime.casts import cast, quantize
from qsync_opt.runtime.recipe import Recipe
from qsync_opt.training.predictor.estimator import BLOCKS, REPEATS
from qsync_opt.training.predictor.measuring import (
    CAST_PAIRS,
    CAST_SIZES,
    fit_line as _fit_line,
    group_threads,
    lockstep_median_ms,  # noqa: F401 (re-exported: the DDP step's and the benchmarks' reading)
    robust_ms,
)
from qsync_opt.training.predictor.on_device import to_device
from qsync_opt.training.runtime.trainer import forward_backward, loss_weight, make_optimizer, rank_batches, shard

CPU = torch.device("cpu")


def rank_data(spec, rank: int):
    """(task, fetch, loss weight) of `rank` as the trainer sees them: fetch() returns the rank's
    slice of the next global batch (task.batch), so a timed step pays what a training step pays
    for its data (the synthetic task labels every new chunk with a teacher forward pass)."""
    import itertools

    batches = rank_batches(spec, None)
    offset, local = shard(batches, rank)
    task, counter = build_task(spec), itertools.count()
    return task, (lambda: task.batch(next(counter), sum(batches), offset, local)), \
        loss_weight(local, len(batches), sum(batches))


def steps_key(spec, gg: OpGraph, group: str) -> str:
    """Profile key of `group`'s whole steps: step_key plus the data and the slice its first rank reads."""

    offset, _ = shard(rank_batches(spec, None), spec.cluster.first_rank(group))
    data = spec.data.source if getattr(spec, "data", None) is not None else "synthetic"
    return f"{step_key(spec.training.optimizer, gg)}|data={data}@{offset}/{spec.training.global_batch}"


def loop_step(spec, rank: int, model: nn.Module, opt, *, all_reduce_loss: bool = False,
              device: torch.device = CPU):
    """The trainer's loop body for `rank` as a zero-argument call: its data (moved to `device`, where
    `model` is), zero_grad, forward, loss, backward (DDP's all-reduce inside, when `model` is wrapped),
    optimizer step, and with `all_reduce_loss` the one scalar all-reduce a DDP trainer makes per step
    (training/runtime/trainer.py; its logging and checkpoints left out). Every whole step timed for the
    planner is this one."""
    import torch.distributed as dist

    task, fetch, weight = rank_data(spec, rank)

    def step():
        inputs, targets = fetch()
        inputs, targets = to_device(inputs, device), targets.to(device)
        with torch.enable_grad():
            opt.zero_grad(set_to_none=True)
            loss = forward_backward(model, task, inputs, targets, weight)
            opt.step()
        if all_reduce_loss:
            dist.all_reduce(torch.stack([loss.float(), torch.zeros(())]))

    return step


def make_step(spec, module: nn.Module, rank: int, gg: OpGraph | None, p: str, op_kernels=None,
              device: torch.device = CPU):
    """A zero-argument whole training step of `module` with every selectable op of `gg` at `p`
    (`gg` may be None for fp32): what the trainer's loop runs for `rank`. `op_kernels`: FQN -> the
    kernels setting the profile measured faster for it (measured_dispatch.winners, at `p`). The
    model is quantized on the CPU and then moved to `device`, as the trainer does."""

    rt = spec.runtime
    torch.manual_seed(spec.training.seed)
    model = copy.deepcopy(module).train()
    if p != "fp32":
        model = apply_plan(model, {n.name: p for n in gg.selectable}, kernels=rt.kernels,
                           weight_granularity=rt.weight_granularity, backward_precision=rt.backward_precision,
                           rounding=rt.rounding, op_kernels=op_kernels,
                           device=spec.cluster.group_of_rank(rank).device_spec)
    model = model.to(device)
    opt = make_optimizer(spec.training, [q for q in model.parameters() if q.requires_grad])
    return loop_step(spec, rank, model, opt, device=device)


#: Untimed steps before a whole step is timed: the first allocates the optimizer's state and the
#: allocator's pools, so it is not a warm kernel call however slow it was.
STEP_WARMUP = 3


def step_times_ms(step, *, warmup: int = STEP_WARMUP, calls: int | None = None) -> list[float]:
    """ms of each of `calls` consecutive steps after `warmup` untimed ones (fixed counts, so the
    ranks of a DDP group take the same steps)."""

    for _ in range(warmup):
        step()
    out = []
    for _ in range(calls or BLOCKS * REPEATS):
        t = time.perf_counter()
        step()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def step_median_ms(step, *, warmup: int = STEP_WARMUP, calls: int | None = None) -> float:
    """Median of `calls` consecutive timed steps after `warmup` untimed ones: the statistic
    `train` reports (run_stages.measured_iteration_ms), so a whole step measured here and the
    iteration a training then shows are read alike. Not the profiler's median of block minima:
    a minimum rejects the preemption a real step pays on a shared machine, and under-reads the
    step a training then shows (docs/predictor.md)."""
    import statistics

    return statistics.median(step_times_ms(step, warmup=warmup, calls=calls))


#: The profiler's whole steps (adaptive_step_times_ms): at least MIN_STEPS timed, at most
#: MAX_STEPS, stopping as soon as their median is stable to STEP_TOLERANCE (relative). Three is
#: the fewest whose median rejects one outlier; the median of three that agree within the
#: tolerance is stable (median_settled), noisier steps take more. Never more than the estimator's
#: blocks × repeats, so QSYNC_OPT_PROFILE_BLOCKS/_REPEATS cap them too.
MAX_STEPS = min(15, BLOCKS * REPEATS)
MIN_STEPS = min(3, MAX_STEPS)
STEP_TOLERANCE = 0.02
#: Untimed steps before the profiler's adaptive timing: the first allocates the optimizer's
#: state and the allocator's pools; from the second on a step is a warm one, and one that is
#: still slow is an outlier the median discards.
PROFILE_STEP_WARMUP = 1


def median_settled(times: list[float], tol: float = STEP_TOLERANCE, *, last: int = 2) -> bool:
    """Whether the median of `times` is stable to `tol`: neither of the `last` latest values
    moved it by more than tol × median (the median without the latest k, k = 1..last)."""
    import statistics

    n = len(times)
    if n <= last:
        return False
    med = statistics.median(times)
    return all(abs(med - statistics.median(times[:n - k])) <= tol * med for k in range(1, last + 1))


def adaptive_step_times_ms(step, *, warmup: int = PROFILE_STEP_WARMUP, least: int = MIN_STEPS,
                           most: int = MAX_STEPS, tol: float = STEP_TOLERANCE, agree=None,
                           on_step=None, clock=None) -> list[float]:
    """ms of consecutive steps after `warmup` untimed ones: at least `least`, then until the median
    is stable to `tol` (median_settled), at most `most`.

    `agree(ms) -> ms`, when given, maps each step's time to the one every rank of a DDP group
    sees (the slowest rank's, through an all-reduce outside the timed call), so that every rank
    stops after the same step; the times returned are still this rank's own. `on_step(ms)` is
    told each timed step (progress). `clock`: seconds, time.perf_counter by default (tests script it)."""

    clock = clock or time.perf_counter
    for _ in range(warmup):
        step()
    own: list[float] = []
    seen: list[float] = []
    while len(own) < most:
        t = clock()
        step()
        ms = (clock() - t) * 1e3
        own.append(ms)
        seen.append(agree(ms) if agree else ms)
        if on_step:
            on_step(ms)
        if len(seen) >= least and median_settled(seen, tol):
            break
    return own


def measure_steps(spec, module: nn.Module, group: str, gg: OpGraph, precisions, *, on_step=None,
                  kernels_of: dict[str, dict[str, str]] | None = None, device: torch.device = CPU,
                  clock=None) -> dict[str, float]:
    """precision -> ms of one whole training step of `group`'s first rank with every selectable op
    at that precision: the median of consecutive steps, as `train` reads its iterations
    (step_median_ms), as many as make it stable (adaptive_step_times_ms; the block-minimum
    estimator would time a whole step too few times per block). `on_step(precision, ms)` is told
    each timed step. `kernels_of`: op -> precision -> the measured winner (measured_dispatch.winners): the
    steps run what the trainer will. `device`, `clock`: where the steps run and the clock read there
    (on_device.py).

    One whole step per precision, because that is what the cost model needs (profile_costs.
    step_terms): the gap between a uniform-p step and the sum of its isolated ops is per precision
    (the quantized modules dispatch more small ops), and uniform plans are costed at these steps."""
    import statistics

    rank = spec.cluster.first_rank(group)
    out = {}
    for p in precisions:
        tell = (lambda ms, p=p: on_step(p, ms)) if on_step else None
        ks = {op: by_p[p] for op, by_p in (kernels_of or {}).items() if p in by_p}
        out[p] = statistics.median(adaptive_step_times_ms(make_step(spec, module, rank, gg, p, ks, device),
                                                          on_step=tell, clock=clock))
    return out


def fp32_step(spec, group: str):
    """`group`'s whole fp32 training step, as a companion rank runs it (colocate.py)."""

    g = next(x for x in spec.cluster.groups if x.name == group)
    torch.set_num_threads(group_threads(g, spec.cluster.world_size))
    torch.manual_seed(spec.training.seed)
    module = build_from_spec(spec).train()
    return make_step(spec, module, spec.cluster.first_rank(group), None, "fp32")  # fp32: no op to swap, no graph


def measure_casts(spec, robust_ms, device: torch.device = CPU) -> dict[str, dict[str, float]]:
    """a·n + b per (src, dst) pair, timed through the runtime's own cast and quantize on `device`."""

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    out = {}
    for src, dst in CAST_PAIRS:
        ms = []
        for n in CAST_SIZES:
            x = torch.randn(n, device=device)
            if src == "int8":
                q = quantize(x, Recipe("int8", spec.runtime.backward_precision))
                ms.append(robust_ms(lambda: q.dequantize(torch.float32)))
            elif dst == "int8":
                r = Recipe("int8", spec.runtime.backward_precision)
                ms.append(robust_ms(lambda: quantize(x, r)))
            else:
                x = x.to(dtypes[src])
                ms.append(robust_ms(lambda: cast(x, dtypes[dst])))
        a, b = _fit_line(list(CAST_SIZES), ms)
        out[f"{src}->{dst}"] = {"a_ms_per_elem": a, "b_ms": b}
    return out


def measure_step(spec, module: nn.Module, inputs, device: torch.device = CPU, clock=time.perf_counter) -> float:
    """ms of one optimizer step plus the loss's forward and backward, on `device` (read by `clock`)."""

    model = copy.deepcopy(module).train().to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = make_optimizer(spec.training, params)
    step = robust_ms(opt.step, clock=clock)
    with torch.no_grad():
        out = model(*to_device(inputs, device)).detach()
    logits = out.reshape(-1, out.size(-1)).float().requires_grad_(True)
    target = torch.randint(0, logits.size(-1), (logits.size(0),), device=device)
    loss = robust_ms(lambda: nn.functional.cross_entropy(logits, target).backward(), clock=clock)
    return step + loss
