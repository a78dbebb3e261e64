"""Costs from a measured profile, for groups whose device was profiled; the roofline otherwise.

Which profile a group uses: its own `profile:` file (any device, e.g. a catalog GPU measured
elsewhere); else, for a device of this machine's kind (cpu-local and its variants on a CPU
machine), this machine's cached profile (`qsync-opt profile SPEC`), measured on first use
when `profile_on_first_use` and absent or incomplete. The section used is the one measured
under the group's `env` and thread count.

Measured op times are of the runtime's own modules, which cast their fp32 input in and their
output back (boundary 'fp32'), so a measured group is costed with that boundary: its casts
are inside the op times and no edge cast is added. The optimizer figure is one step plus
the loss's forward and backward.

Whole-step terms (`step_terms`): the profile also holds one whole training step per
precision p (every selectable op at p), timed with the same estimator. Its difference from
the sum this module predicts for that uniform plan, gap_p, is what isolated ops miss
(autograd bookkeeping, dispatch, zero_grad, allocator, colder caches, a co-located rank's
contention). Each selectable op's forward and backward at p are scaled by
1 + gap_p / S_p (S_p: their sum at p), i.e. the gap is shared in proportion to each op's
measured time. It happens inside the step, before the gradients are ready, so in a lockstep
it delays the all-reduce and not the optimizer. (Charged to the optimizer figure, a fast
group's gap would land after the slow group's all-reduce and lengthen the lockstep; spread
evenly, a negative gap of a slow format could drive its small ops to 0 ms, cheaper than fp32,
for the solver to pick: docs/predictor.md.) Uniform plans are then costed at
their measured steps, mixed plans by this split. A profile's gloo all-reduce fit α + β·bytes replaces the
interconnect preset's figures for a cluster whose ranks all run here.

DDP calibration (`ddp_calibrate`): for such a cluster the profile also holds one whole fp32
DDP step, every rank running at once (allreduce_profile.measure_ddp_step), and the replay
of that same uniform-fp32 plan is brought to it: what it costs beyond the replay (DDP's
buffer broadcast and bucket copies, gloo's threads competing with backward for shared
cores) is charged once per iteration; when it costs less, the co-located profile
over-counted contention (its busy companions never wait; a lockstep's faster rank does)
and every op is scaled by the measured ratio. Other plans follow from that calibration.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from qsync_opt.errors import SpecError
from qsync_opt.models.graph import OpGraph
from qsync_opt.training.predictor.costs import OpCost
from qsync_opt.training.predictor.profile import (Profile, ProfileError, Section, default_profile_path,
                                                  load_profile, op_signature, runtime_tag, step_key)
from qsync_opt.training.predictor.measuring import ddp_key, gpu_not_profiled, group_threads, is_local, local_ranks
from qsync_opt.training.predictor.measured_dispatch import winners
from qsync_opt.training.predictor.replayer import replay
from qsync_opt.training.predictor import profile_run


@dataclass(frozen=True)
class MeasuredCosts:
    costs: dict[str, dict[str, OpCost]]
    other_costs: dict[str, dict[str, OpCost]]
    optimizer_ms: float
    source: str
    """'measured (<profile file>, <section>)'."""
    step_gap_ms: dict[str, float]
    """precision -> measured whole step − the sum of its isolated ops (ms); see `step_terms`."""
    kernels: dict[str, dict[str, str]] = field(default_factory=dict)
    """Selectable op -> precision -> the implementation the profile measured faster (measured_dispatch.winners)."""


@dataclass(frozen=True)
class StepTerms:
    """One section's costs of a graph, with its measured whole steps folded in (`step_terms`)."""

    costs: dict[str, dict[str, OpCost]]
    """Selectable op -> precision -> cost."""
    other_costs: dict[str, dict[str, OpCost]]
    """Fixed op -> {"fp32": cost}."""
    optimizer_ms: float
    step_gap_ms: dict[str, float]
    """precision -> measured whole step − the sum of its isolated ops (ms)."""


class Incomplete(Exception):
    """The profile lacks entries this group needs (listed)."""

    def __init__(self, missing: list[str]):
        super().__init__(f"{len(missing)} entries missing, e.g. {missing[:2]}")
        self.missing = missing


def section_costs(sec: Section, gg: OpGraph, offer: tuple[str, ...], optimizer: str,
                  steps_at: str | None = None) -> StepTerms:
    """The costs of `gg` from one section, the whole-step terms folded in (`step_terms`)."""
    missing = []

    def get(node, p) -> OpCost:
        e = sec.ops.get(op_signature(node, p))
        if e is None:
            missing.append(op_signature(node, p))
            return OpCost(0.0, 0.0)
        return OpCost(e["fwd_ms"], e["bwd_ms"])

    costs = {n.name: {p: get(n, p) for p in offer} for n in gg.selectable}
    other = {n.name: {"fp32": get(n, "fp32")} for n in gg.fixed}
    key = step_key(optimizer, gg)
    opt = sec.optimizer.get(key)
    skey = steps_at or key  # step_profile.steps_key: the whole steps also depend on the data and slice
    steps = sec.steps.get(skey, {})
    if opt is None:
        missing.append(key)
    missing += [f"steps[{skey}][{p}]" for p in offer if p not in steps]
    if missing:
        raise Incomplete(missing)
    return step_terms(costs, other, opt, {p: steps[p] for p in offer})


def step_terms(costs: dict, other: dict, opt: float, steps: dict[str, float]) -> StepTerms:
    """Fold measured whole steps into op costs.

    gap_p = step_p − (S_p + Σ other ops + opt), S_p = Σ selectable op fwd+bwd at p; each selectable
    op's fwd and bwd at p are scaled by max(0, 1 + gap_p / S_p); the optimizer figure stays the
    measured step + loss.
    """
    fixed = sum(c.fwd_ms + c.bwd_ms for per in other.values() for c in per.values())
    sel = {p: sum(per[p].fwd_ms + per[p].bwd_ms for per in costs.values() if p in per) for p in steps}
    gap = {p: ms - (fixed + opt + sel[p]) for p, ms in steps.items()}
    scale = {p: max(0.0, 1 + gap[p] / sel[p]) if sel[p] > 0 else 1.0 for p in gap}
    out = {name: {p: OpCost(c.fwd_ms * scale.get(p, 1.0), c.bwd_ms * scale.get(p, 1.0), c.weight_cast_ms)
                  for p, c in per.items()} for name, per in costs.items()}
    return StepTerms(out, other, opt, gap)


def profile_for(group, spec_dir: Path | None = None) -> Path | None:
    """The profile file a group should use, or None (roofline)."""

    if group.profile:
        p = Path(group.profile)
        return p if p.is_absolute() or spec_dir is None else spec_dir / p
    return default_profile_path() if is_local(group.device_spec) else None


def measured_costs(spec, group, gg: OpGraph, offer: tuple[str, ...],
                   *, profile_on_first_use: bool = False, log=None) -> tuple[MeasuredCosts | None, str]:
    """Measured costs of `group`, or (None, why not) when the roofline must be used."""

    if spec.costs == "roofline":
        return None, "roofline (costs: roofline)"
    if group.profile is None and is_local(group.device_spec) and (gpu_why := gpu_not_profiled(spec, group)):
        if spec.costs == "measured":
            raise ProfileError(f"cluster.groups[{group.name}]: costs: measured, but {gpu_why}; use costs: auto "
                               "(the roofline, calibrated where the device has factors) or give a profile: file")
        return None, f"roofline ({gpu_why})"
    path = profile_for(group)
    if path is None:
        if spec.costs == "measured":
            raise SpecError(f"cluster.groups[{group.name}]: costs: measured, but device {group.device_spec.name} "
                            "does not run here and the group has no profile: file; give one or use costs: auto")
        return None, f"roofline ({group.device_spec.name} is not on this machine and has no profile: file)"
    threads = group_threads(group, spec.cluster.world_size)
    for attempt in (0, 1):
        prof: Profile | None = _load_for(group, path) if path.exists() else None
        sec = prof.find_section(group.env, threads, local_ranks(spec), runtime_tag(spec.runtime)) if prof else None
        why = f"no profile at {path}" if prof is None else (
            f"profile {path} has no section for env {group.env or '{}'} with {threads} thread(s)"
            + (f" beside {local_ranks(spec) - 1} other busy rank(s)" if local_ranks(spec) > 1 else "")
            + (f" under runtime {tag}" if (tag := runtime_tag(spec.runtime)) else "") if sec is None else "")
        if sec is not None:
            try:
                from qsync_opt.training.predictor.step_profile import steps_key  # import cost: the trainer stack

                t = section_costs(sec, gg, offer, spec.training.optimizer, steps_key(spec, gg, group.name))
                first = "; profiled on first use" if attempt else ""
                return MeasuredCosts(t.costs, t.other_costs, t.optimizer_ms, f"measured ({path}{first})", t.step_gap_ms,
                                     winners(sec.dispatch, gg, offer, spec.runtime.kernels)), ""
            except Incomplete as e:
                why = f"profile {path} lacks {len(e.missing)} of this model's entries (e.g. {e.missing[0]!r})"
        can_measure = group.profile is None and (profile_on_first_use or spec.costs == "measured")
        if attempt == 1 or not can_measure:
            if spec.costs == "measured":
                raise ProfileError(f"cluster.groups[{group.name}]: costs: measured, but {why}; "
                                   f"run `qsync-opt profile SPEC -o {path}`")
            if gg.captured_by == "export":  # the profiler replays fx graphs: it refuses this model
                return None, (f"roofline ({why}; this model is captured by torch.export, which the per-op profiler "
                              "cannot replay, so its costs stay roofline: set costs: roofline to say so)")
            return None, f"roofline ({why}; run `qsync-opt profile SPEC`)"
        log = log or (lambda s: print(s, file=sys.stderr))
        log(f"note: {why}; profiling this machine now (first use; `qsync-opt profile SPEC` does it ahead)")
        profile_run.profile_spec(spec, path, groups=[group.name], allreduce=spec.cluster.world_size > 1, progress=False, log=log)
    return None, "roofline"


def _load_for(group, path: Path) -> Profile:
    """A profile of this machine for devices that run here; of the group's own device otherwise."""

    if is_local(group.device_spec):
        return load_profile(path)  # refused, by name, when measured on another machine
    prof = load_profile(path, check_machine=False)
    m, dev = prof.machine, group.device_spec
    if dev.kind == "cpu" or m.get("kind") != "cuda" or dev.name.lower().split("-")[0] not in m.get("gpu", "").lower().replace(" ", ""):
        raise ProfileError(f"cluster.groups[{group.name}].profile: {path} was measured on {m.get('gpu') or m.get('cpu')!r}, "
                           f"not on a {dev.name}; give a profile measured on that device")
    return prof


def measured_link(spec, path: Path | None) -> tuple[float, float] | None:
    """(bandwidth GB/s, latency µs) equivalent of the profile's gloo fit for the world size."""
    if path is None or not path.exists() or spec.cluster.world_size < 2:
        return None
    fit = load_profile(path).allreduce.get(f"gloo/{spec.cluster.world_size}")
    if not fit:
        return None
    n = spec.cluster.world_size
    beta = max(fit["beta_ms_per_byte"], 1e-15)
    # allreduce_ms = 2(n−1)/n · B / (bw·1e6) + 2(n−1) · lat / 1e3   (comm.py)
    return 2 * (n - 1) / n / (beta * 1e6), fit["alpha_ms"] * 1e3 / (2 * (n - 1))



def ddp_calibrate(spec, gcs: list, proto) -> tuple[list, str] | None:
    """The groups' costs made to agree with the measured fp32 DDP step, and a note saying how;
    None when not every group is measured here or the profile has no such step.

    Replay of the uniform-fp32 plan below the measured step: the excess is DDP's own work
    per iteration (buffer broadcast, bucket copies, gloo threads taking cores from backward),
    charged once per iteration on every group's per-step figure. Above it: the co-located
    profile over-counted contention, since its companions never idle while in a lockstep
    the faster rank waits for the slower one, leaving it a core; every group's op and
    per-step figures are scaled by measured / replayed (the all-reduce fit is left alone).
    """
    from dataclasses import replace

    if spec.cluster.world_size < 2 or not all(gc.cost_source.startswith("measured") for gc in gcs):
        return None
    paths = {profile_for(g) for g in spec.cluster.groups}
    path = paths.pop() if len(paths) == 1 else None
    if path is None or not path.exists() or not all(is_local(g.device_spec) for g in spec.cluster.groups):
        return None
    entry = load_profile(path).allreduce.get(ddp_key(spec))
    if not entry or not all("fp32" in per for gc in gcs for per in gc.costs.values()):
        return None
    uniform = {gc.name: {op: "fp32" for op in gc.costs} for gc in gcs}
    replayed = replay(replace(proto, groups=tuple(gcs)), uniform).iteration_ms
    measured = entry["fp32_ms"]
    head = f"measured fp32 DDP step {measured:.2f} ms, its replay {replayed:.2f} ms ({path})"
    if measured >= replayed:
        over = measured - replayed
        return ([replace(gc, optimizer_ms=gc.optimizer_ms + over) for gc in gcs],
                f"DDP term {over:.2f} ms per iteration: {head}")
    f = measured / replayed

    def scaled(table):
        return {op: {p: OpCost(c.fwd_ms * f, c.bwd_ms * f, c.weight_cast_ms * f) for p, c in per.items()}
                for op, per in table.items()}

    return ([replace(gc, costs=scaled(gc.costs), other_costs=scaled(gc.other_costs), optimizer_ms=gc.optimizer_ms * f)
             for gc in gcs], f"DDP contention factor {f:.3f} on every op: {head}")
