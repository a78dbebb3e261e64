"""Measure the runtime's own kernels on this machine: the costs the planner should believe.

Per device group that runs here (a CPU group on the CPU, a GPU group on its GPU with a CUDA-event
clock: on_device.py), in a subprocess that carries
the group's `env` (ONEDNN_MAX_CPU_ISA changes which oneDNN kernels run) and its thread
count: for every distinct (op kind, shapes) of the model's graph at the group's local batch,
forward and backward time of the op as the runtime runs it — selectable modules swapped for
the runtime's quantized module at every precision the group may use, everything else as
traced — plus cast fits a·n + b, one optimizer step with the loss, and one whole training
step per precision (step_profile.py: what the isolated ops miss). When several ranks train
here, all their processes run at once (colocate.py), and then time, together, a gloo
all-reduce fit α + β·bytes and one whole fp32 DDP step (allreduce_profile.py).

Each distinct op signature (op kind, shapes, FLOPs, precision: profile.op_signature) is timed
once, by the first op that has it, and every op that shares it reads that entry: a model of
twelve identical blocks costs one block's timings (distinct_todo). Each op runs in isolation on
the very tensors the traced model feeds it (an fx Interpreter records them). Estimator
(estimator.py): the median of block minima, adaptive in warm-ups, repeats and blocks; whole
steps: the median of as many consecutive steps as make it stable (step_profile.
adaptive_step_times_ms). The progress bar counts seconds of measuring and shows the time left.
The profile file is saved every SAVE_EVERY_S seconds of op timings, so an interrupted run resumes
where it stopped, less that much.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.fx as fx
from torch import nn

from qsync_opt.errors import ModelError, SpecError
from qsync_opt.models import trace_walk as walk  # trace's graph walk: its classification and naming
from qsync_opt.models.graph import OpGraph
from qsync_opt.training.spec import JobSpec, load_spec
from qsync_opt.training.predictor.measuring import (  # noqa: F401
    CAST_PAIRS, CAST_SIZES, ProgressBar, ddp_key, fit_line, group_threads, is_local, local_ranks, robust_ms)
from qsync_opt.training.predictor.profile import (Profile, ProfileError, Section, load_profile, op_signature,
                                                  runtime_tag, step_key)
from qsync_opt.models.from_spec import build_from_spec, input_maker
from qsync_opt.runtime.qmodules import SWAPPABLE
from qsync_opt.runtime.recipe import Recipe
from qsync_opt.training.predictor.allreduce_profile import collectives
from qsync_opt.kernels.dispatch import Target, kernel_choices
from qsync_opt.training.predictor.colocate import keep_busy
from qsync_opt.training.predictor.on_device import device_clock, profile_device, to_device
from qsync_opt.training.predictor.measured_dispatch import SCREEN_CALLS, race, shape_class, winners
from qsync_opt.training.predictor.profile_run import profile_spec  # noqa: F401 (this module's entry, kept)
from qsync_opt.training.predictor.step_profile import (
    MIN_STEPS, PROFILE_STEP_WARMUP, fp32_step, measure_casts, measure_step, measure_steps, steps_key)

from qsync_opt.models import tracing as tr  # noqa: E402






# --------------------------------------------------------------------------- graph walk
class _Values(fx.Interpreter):
    """One training-mode forward that keeps every node's real output (detached)."""

    def __init__(self, gm):
        super().__init__(gm)
        self.out: dict[str, object] = {}
        self.grad: dict[str, bool] = {}

    def run_node(self, n):
        r = super().run_node(n)
        if isinstance(r, torch.Tensor):
            self.out[n.name], self.grad[n.name] = r.detach(), r.requires_grad
        else:
            self.out[n.name] = r
        return r


def fx_nodes(gm: fx.GraphModule, desc: dict) -> dict[str, fx.Node]:
    """OpGraph op name -> fx node, by the very walk and naming tracing.py uses."""
    act, used, counters, out = {}, set(), {}, {}
    for n in gm.graph.nodes:
        data_in = [u for u in n.all_input_nodes if walk.carries_data(desc, u)]
        is_tensor = desc.get(n.name, ("other",))[0] in ("tensor", "tensors")
        act[n.name] = (n.op == "placeholder" and is_tensor) or (is_tensor and any(act[u.name] for u in data_in))
        op = walk.classify_op(gm, n, desc, act, data_in)
        act[n.name] = act[n.name] or (op is not None and is_tensor)
        if op is None:
            continue
        name, _ = walk.name_op(n, used, counters)
        out[name] = n
    return out


def _op_callable(gm, n: fx.Node, vals: _Values, module_for: Callable[[nn.Module], nn.Module]):
    """(call, leaves): a zero-argument call running node `n` alone, and its gradient leaves."""
    leaves: list[torch.Tensor] = []

    def arg(u: fx.Node):
        v = vals.out[u.name]
        if isinstance(v, torch.Tensor):
            v = v.clone()
            if vals.grad.get(u.name) and v.is_floating_point():
                v.requires_grad_(True)
                leaves.append(v)
        return v

    args = fx.node.map_arg(n.args, arg)
    kwargs = fx.node.map_arg(n.kwargs, arg)
    inplace = bool(kwargs.get("inplace"))
    if n.op == "call_module":
        mod = module_for(gm.get_submodule(n.target))
        inplace = inplace or bool(getattr(mod, "inplace", False))
        leaves += [p for p in mod.parameters() if p.requires_grad]
        fn = lambda *a: mod(*a, **kwargs)  # noqa: E731
    elif n.op == "call_method":
        fn = lambda *a: getattr(a[0], n.target)(*a[1:], **kwargs)  # noqa: E731
    else:
        fn = lambda *a: n.target(*a, **kwargs)  # noqa: E731
    if inplace:  # in-place ops may not write into a leaf: feed a non-leaf copy
        return (lambda: fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])), leaves, True
    return (lambda: fn(*args)), leaves, False


def _outputs(r) -> list[torch.Tensor]:
    rs = r if isinstance(r, (tuple, list)) else [r]
    return [t for t in rs if isinstance(t, torch.Tensor) and t.requires_grad]


def screen_fwd_ms(call, clock=time.perf_counter) -> float:
    """The quickest of SCREEN_CALLS forwards of `call` after one untimed (measured_dispatch's screen)."""
    with torch.enable_grad():
        call()
        best = float("inf")
        for _ in range(SCREEN_CALLS):
            t = clock()
            call()
            best = min(best, (clock() - t) * 1e3)
    return best


def time_op(call, leaves, inplace: bool, clone_ms: float, clock=time.perf_counter) -> tuple[float, float]:
    """(fwd_ms, bwd_ms) of one op run alone; the copy fed to an in-place op is not counted.
    `clock`: seconds on the op's device (on_device.device_clock)."""
    def clear():
        for t in leaves:
            t.grad = None

    with torch.enable_grad():
        fwd = robust_ms(call, clock=clock)
        if inplace:
            fwd = max(0.0, fwd - clone_ms)
        outs = _outputs(call())
        if not outs:
            return fwd, 0.0
        grads = [torch.randn_like(o) for o in outs]
        bwd = robust_ms(lambda: torch.autograd.backward(outs, grads, retain_graph=True), before=clear, clock=clock)
    return fwd, bwd


# --------------------------------------------------------------------------- one group
#: Seconds of op timings between two saves of the profile file (each save rewrites and fsyncs it).
SAVE_EVERY_S = 1.0


def distinct_todo(gg: OpGraph, precisions, have) -> list[tuple[object, str]]:
    """(node, precision) to measure: one per distinct op signature (op kind, shapes, FLOPs,
    precision) of `gg` not already in `have`, the first node that has it standing for every
    other (selectable ops at each of `precisions`, the others at fp32). The twelve identical
    blocks of a transformer are measured once, and every op that shares a signature reads the
    same entry (profile_costs.section_costs looks entries up by signature)."""
    seen, out = set(have), []
    for node in gg.nodes:
        for p in (precisions if node.selectable else ("fp32",)):
            sig = op_signature(node, p)
            if sig not in seen:
                seen.add(sig)
                out.append((node, p))
    return out


def steps_estimate_s(sec: Section, gg: OpGraph, precisions) -> float:
    """Seconds the whole steps at `precisions` will take to time, for the progress bar's time
    left: each step taken as the sum of its ops' times measured so far (ops not yet measured
    at the mean of those that are), times the fewest steps adaptive_step_times_ms times."""
    total = 0.0
    for p in precisions:
        known = [e["fwd_ms"] + e["bwd_ms"] for node in gg.nodes
                 if (e := sec.ops.get(op_signature(node, p if node.selectable else "fp32"))) is not None]
        if known:
            total += sum(known) * len(gg.nodes) / len(known) * (PROFILE_STEP_WARMUP + MIN_STEPS)
    return total / 1e3


class _Eta:
    """The profile's progress in seconds of measuring, so that rich's time left is in seconds:
    the bar advances by the time each op and each timed whole step took, and its total is
    re-estimated as it goes (the ops left at the mean so far, the steps by steps_estimate_s)."""

    def __init__(self, bar: ProgressBar, ops: int):
        import time

        self.bar, self.clock = bar, time.perf_counter
        self.ops_left, self.ops_done = ops, 0
        self.t = self.start = self.clock()
        self.steps_left_s = 0.0

    def _tick(self, left_s: float):
        now = self.clock()
        self.bar.advance(now - self.t)
        self.t = now
        self.bar.set_total(now - self.start + left_s)

    def op_done(self, steps_s: float):
        self.ops_left, self.ops_done = self.ops_left - 1, self.ops_done + 1
        self._tick((self.clock() - self.start) / self.ops_done * self.ops_left + steps_s)

    def steps_begin(self, steps_s: float):
        self.steps_left_s = steps_s
        self._tick(steps_s)

    def step_done(self, ms: float):
        self.steps_left_s = max(self.steps_left_s - ms / 1e3, ms / 1e3)  # at least one more, until told done
        self._tick(self.steps_left_s)

    def close(self):
        self._tick(0.0)
        self.bar.close()


def profile_group(spec: JobSpec, group: str, path: "str | Path", *, graph: OpGraph | None = None,
                  progress: bool = True) -> Section:
    """Measure `group`'s ops into the profile at `path` (resuming what it already holds).

    Runs in the current process: the caller sets the group's env (see `profile_spec`).
    """

    g = next((x for x in spec.cluster.groups if x.name == group), None)
    if g is None:
        raise SpecError(f"group {group!r} is not in cluster.groups ({', '.join(x.name for x in spec.cluster.groups)})")
    threads = group_threads(g, spec.cluster.world_size)
    torch.set_num_threads(threads)
    device = profile_device(g)
    clock = device_clock(device)
    prof = load_profile(path) if Path(path).exists() else Profile.new()
    sec = prof.section(g.env, threads, local_ranks(spec), runtime_tag(spec.runtime))
    lb = spec.local_batches()[group]
    torch.manual_seed(spec.training.seed)
    module = build_from_spec(spec).train()
    make = input_maker(spec)
    if graph is None:
        graph = tr.trace(module, make(1, torch.Generator().manual_seed(0)), model_name=spec.model.name or "custom",
                         leaf_modules=spec.model.leaf_modules)
    gg = graph.for_batch(lb)
    inputs = tuple(make(lb, torch.Generator().manual_seed(0)))
    try:
        gm = tr.symbolic_trace(module, spec.model.leaf_modules)
    except ModelError as e:  # captured by torch.export for planning, but this profiler replays fx nodes
        raise ProfileError(f"profiler: {spec.model.name or spec.model.import_!r} cannot be profiled per operator: the "
                           "profiler replays a symbolic-fx graph op by op and fx cannot follow this model (it is "
                           f"planned from a torch.export capture); use costs: roofline for it. fx said: {e}") from None
    on_dev = to_device(inputs, device)
    vals = _Values(copy.deepcopy(gm).to(device))  # `module` stays as built, on the CPU: the whole steps start from it
    names = fx_nodes(vals.module, tr.record_shapes(vals.module, on_dev))  # eval mode, no grad: BN statistics untouched
    with torch.enable_grad():
        vals.run(*on_dev)
    rt = spec.runtime
    backward = g.device_spec.backward_format(rt.backward_precision)  # what the trainer runs on this device
    todo = distinct_todo(gg, g.allowed_precisions, sec.ops)
    skey = steps_key(spec, gg, group)
    step_ps = [] if skey in sec.steps else list(g.allowed_precisions)
    clone_cache: dict[str, float] = {}
    eta = _Eta(ProgressBar(progress, f"profiling {group} ({spec.model.name or 'model'}, batch {lb})",
                           len(todo) + len(step_ps)), len(todo))
    saved = eta.clock()
    target = Target.of_device_spec(g.device_spec)
    for node, p in todo:
        n = names.get(node.name)
        if n is None:
            raise ProfileError(f"profiler: op {node.name!r} of the graph has no fx node; cannot time it")

        def op_at(kernels: str, p=p, node=node, n=n):
            def module_for(m):
                if p == "fp32" or not node.selectable or type(m) not in SWAPPABLE:
                    return m
                # as the trainer: quantized on the CPU (runtime.apply_plan), then moved to the device
                return SWAPPABLE[type(m)].from_float(copy.deepcopy(m).cpu(), Recipe(
                    p, backward, rt.weight_granularity, rt.rounding, kernels)).to(device)

            call, leaves, inplace = _op_callable(vals.module, n, vals, module_for)
            clone_ms = 0.0
            if inplace:
                x = vals.out[n.all_input_nodes[0].name]
                key = "x".join(map(str, x.shape))
                clone_ms = clone_cache.setdefault(key, robust_ms(lambda: x.clone(), clock=clock))
            return call, leaves, inplace, clone_ms, clock

        cls = shape_class(node, p)
        swapped = node.selectable and p != "fp32" and n.op == "call_module" \
            and type(vals.module.get_submodule(n.target)) in SWAPPABLE
        choices = kernel_choices(target, p, rt.kernels) if swapped else (rt.kernels,)
        if swapped and rt.kernels == "auto" and cls in sec.dispatch:  # raced at an earlier op of its class
            choices = (sec.dispatch[cls]["impl"],)
        if len(choices) > 1:
            built: dict[str, tuple] = {}  # each candidate's module is quantized once, for its screen and its timing
            at = lambda k: built[k] if k in built else built.setdefault(k, op_at(k))  # noqa: E731
            winner, (fwd, bwd), record = race(choices, lambda k: screen_fwd_ms(at(k)[0], clock), lambda k: time_op(*at(k)))
            sec.dispatch[cls] = {"impl": winner, "at": op_signature(node, p), "candidates": record}
        else:
            fwd, bwd = time_op(*op_at(choices[0]))
        sec.ops[op_signature(node, p)] = {"fwd_ms": fwd, "bwd_ms": bwd}
        if eta.clock() - saved >= SAVE_EVERY_S:  # an interrupted run loses at most that much
            prof.save(path)
            saved = eta.clock()
        eta.op_done(steps_estimate_s(sec, gg, step_ps))

    vals = None  # every op's activations: freed before the whole steps need the device's memory
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not sec.casts:
        sec.casts = measure_casts(spec, lambda fn: robust_ms(fn, clock=clock), device)
    key = step_key(spec.training.optimizer, gg)
    if key not in sec.optimizer:
        sec.optimizer[key] = measure_step(spec, module, inputs, device, clock)
    if step_ps:
        eta.steps_begin(steps_estimate_s(sec, gg, step_ps))
        sec.steps[skey] = measure_steps(spec, module, group, gg, step_ps, on_step=lambda p, ms: eta.step_done(ms),
                                        kernels_of=winners(sec.dispatch, gg, step_ps, rt.kernels),
                                        device=device, clock=clock)
    prof.save(path)
    eta.close()
    return sec


# --------------------------------------------------------------------------- whole spec
def main(argv: list[str] | None = None) -> int:
    """Subprocess entry: `python -m qsync_opt.training.predictor.profiler SPEC.json GROUP PROFILE [--quiet]
    [--busy DIR --peers N [--busy-only] [--rank R --world W [--ddp] [--allreduce]]]` (colocate.py:
    with --ddp first take the fp32 DDP step with every rank; profile; keep running steps until N
    profilers are done; then with --allreduce time the gloo all-reduce with every rank)."""
    argv = sys.argv[1:] if argv is None else argv
    spec_file, group, path = argv[:3]
    busy = Path(argv[argv.index("--busy") + 1]) if "--busy" in argv else None
    try:
        spec = load_spec(spec_file)
        if busy is not None and "--ddp" in argv:  # before anything else runs here: as fresh as train's ranks
            collectives(spec, int(argv[argv.index("--rank") + 1]), int(argv[argv.index("--world") + 1]),
                        f"file://{busy / 'store-ddp'}", busy, ar=False, ddp=True)
        if "--busy-only" not in argv:
            profile_group(spec, group, path, progress="--quiet" not in argv)
        if busy is not None:
            keep_busy(fp32_step(spec, group), busy, int(argv[argv.index("--peers") + 1]),
                      done_name=None if "--busy-only" in argv else group)
            if "--allreduce" in argv:  # every rank, together
                collectives(spec, int(argv[argv.index("--rank") + 1]), int(argv[argv.index("--world") + 1]),
                            f"file://{busy / 'store'}", busy, ar=True, ddp=False)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from qsync_opt.runtime.process_exit import exit_without_destructors

    exit_without_destructors(main())  # co-located profilers run gloo collectives: see process_exit.py
