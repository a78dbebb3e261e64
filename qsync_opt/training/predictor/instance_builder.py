"""From a spec, a traced graph and a sensitivity to the TrainingInstance the solvers take.

Per device group: the graph rescaled to the group's local batch; roofline op costs at every
precision the group may use (the group's list ∩ the device's native formats); cast costs on
every selectable edge; the memory model; and the DDP bucket plan.

Time bound (QSync's default, objective.max_iteration_time = 'auto'): training groups (role
'training', or role 'auto' and an all-highest-precision iteration within 5% of the fastest
group's) stay at their highest precision and set the bound: the lockstep iteration they make
alone on the shared clock (their forward, backward and all-reduces, then every group's
optimizer step, the slowest included), the least any plan of the others can reach. A number
instead bounds every group; groups declared 'training' still stay at their highest precision.
Either way the bound is on the lockstep iteration (lockstep.py), as the replayer computes it.

time_ms[op][p] is the op's own time plus that of the non-selectable ops that follow it
(followers.py); fixed_ms holds the non-selectable ops that follow none and the optimizer step,
so the main row is the group's compute; sync_rows hold the bucket terms of the lockstep
iteration (lockstep.py), the all-reduces included, exactly.

A precision that is slower than a more accurate one at the same op is not offered
(`drop_dominated`): it could only cost accuracy. This holds for groups whose costs are measured
or calibrated (on an H100/H200 it removes the fp8/int8 linears, which measured slower than
bf16 there). Datasheet-only groups keep every format: their efficiencies are judgements, and an
optimal plan already prefers the faster, more accurate format wherever memory allows.

Memory capacity = device memory × 0.95 − 0.5 GB runtime overhead (memory.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from qsync_opt.errors import SpecError
from qsync_opt.hardware.calibration import op_kind, sources_of
from qsync_opt.kernels.dispatch import FP8_SM
from qsync_opt.models.graph import OpGraph
from qsync_opt.training.program.instance import Assignment, GroupInstance, TrainingInstance, row_ms
from qsync_opt.training.predictor.lockstep import lockstep_rows
from qsync_opt.training.spec import JobSpec
from qsync_opt.training.predictor.casts import edge_cast_ms, resolve_backward_precision
from qsync_opt.training.predictor.comm import ddp_buckets
from qsync_opt.training.predictor.context import Context, GroupContext
from qsync_opt.training.predictor.costs import fp8_grads, op_costs, optimizer_ms
from qsync_opt.training.predictor.followers import BOUNDARIES, follow_format, follower_costs, owners
from qsync_opt.training.predictor.memory import capacity_bytes, memory_model
from qsync_opt.training.predictor.profile_costs import ddp_calibrate, measured_costs, measured_link, profile_for
from qsync_opt.training.predictor.replayer import replay_group
from qsync_opt.training.predictor.sensitivity import Sensitivity

#: A group is a training group under role 'auto' when its all-highest iteration is within this
#: fraction of the fastest group's.
AUTO_TRAINING_SLACK = 0.05


def _omega(sensitivity: Sensitivity | Mapping) -> Mapping[str, Mapping[str, float]]:
    return sensitivity.omega if isinstance(sensitivity, Sensitivity) else sensitivity


def _check_omega(omega, group: str, allowed: Mapping[str, tuple[str, ...]]) -> None:
    for op, ps in allowed.items():
        have = omega.get(op)
        missing = [p for p in ps if have is None or p not in have]
        if missing:
            raise SpecError(
                f"sensitivity: no ω for op {op!r} at {missing} (needed by group {group!r}); "
                f"compute the indicator with precisions including {list(ps)}"
            )


def _group_context(spec: JobSpec, g, graph: OpGraph, local_batch: int, boundary: str, log=None) -> GroupContext:
    dev = g.device_spec.with_kernels(spec.runtime.kernels)  # priced as the runtime's dispatch runs it
    offer = tuple(p for p in g.allowed_precisions if dev.supports(p))
    if not offer:
        raise SpecError(
            f"cluster.groups[{g.name}].precisions: none runs natively on {dev.name} with runtime.kernels="
            f"{spec.runtime.kernels}; it runs {list(dev.precisions)}"
        )
    gg = graph.for_batch(local_batch)
    bwd = resolve_backward_precision(spec.runtime.backward_precision, dev)
    world = spec.cluster.world_size
    measured, why = measured_costs(spec, g, gg, offer, log=log)  # profile_costs.py: measured or None
    if measured is not None:
        boundary = "fp32"  # the runtime's modules were timed with their own fp32 casts inside
    owner = owners(gg, boundary)
    gc = GroupContext(
        name=g.name,
        device=dev,
        count=g.count,
        local_batch=local_batch,
        role="training" if g.role == "training" else "inference",
        graph=gg,
        backward_precision=bwd,
        allowed={n.name: offer for n in gg.selectable},
        costs=op_costs(gg, dev, precisions=offer, backward_precision=spec.runtime.backward_precision,
                       boundary=boundary),  # unresolved: fp8 linears under 'fp8' run fp8 GEMMs (costs.fp8_grads)
        other_costs=follower_costs(gg, dev, owner),
        owner=owner,
        optimizer_ms=optimizer_ms(gg, spec.training.optimizer, dev),
        memory=memory_model(gg, offer, spec.training.optimizer, world_size=world, owner=owner,
                            backward_precision=bwd),
        buckets=ddp_buckets(gg),
        mem_capacity_bytes=capacity_bytes(dev.memory_bytes, dev.kind),
        boundary=boundary,
    )
    # --- cost source: a measured profile replaces the roofline figures (profile_costs.py)
    if measured is None:
        return replace(gc, cost_source=roofline_source(dev, gg, offer, why, spec.runtime.backward_precision))
    return replace(gc, costs=measured.costs, other_costs=measured.other_costs,
                   optimizer_ms=measured.optimizer_ms, cost_source=measured.source, kernels=measured.kernels)


def roofline_source(dev, graph: OpGraph, offer: tuple[str, ...], why: str, backward_precision: str = "bf16") -> str:
    """`why` ('roofline (<reason>)') saying whether the roofline is calibrated, for which op kinds and
    precisions of this graph and from which results files, or datasheet only. An fp8 linear whose backward runs in
    fp8 (costs.fp8_grads) counts as calibrated only where a factor was measured that way."""
    asked = {(op_kind(n.kind), p, "fp8" if fp8_grads(n.kind, p, backward_precision) else None)
             for n in graph.selectable for p in offer}
    found = {(k, p) for k, p, bwd in asked if k and dev.calibration(p, k, bwd) is not None}
    cal = {k: [p for p in offer if (k, p) in found] for k in sorted({k for k, _ in found})}
    if not cal:
        head = "roofline, datasheet only"
    else:
        ops = "; ".join(f"{k} ops at {', '.join(ps)}" for k, ps in sorted(cal.items()))
        head = (f"roofline, calibrated: {ops} priced by sm_{dev.sm} factors fitted on {', '.join(sources_of(dev))}, "
                "every other op by the datasheet")
    return head + why[len("roofline"):] if why.startswith("roofline") else f"{head} ({why})"


def drop_dominated(gc: GroupContext, omega) -> tuple[GroupContext, str]:
    """`gc` without the precisions that would only cost accuracy, and a note naming them ('' if none).

    At one op, precision p is dropped when a precision q listed before it (higher) has ω_q ≤ ω_p,
    is strictly faster in total (op plus the followers that take its format) and no slower in
    the forward part (forward and weight cast), so that every lockstep row (lockstep.py) is no
    longer at q: a plan using p is then matched by the plan using q, no slower and no less
    accurate. The highest precision is never dropped. Edge casts ('edge' boundary) are not part of
    the comparison. Memory is: when the group fits at each op's lowest-memory precision but would
    not without the dropped ones, nothing is dropped (the note says so).
    """
    followers: dict[str, list[str]] = {}
    for f, own in gc.owner.items():
        if own is not None:
            followers.setdefault(own, []).append(f)

    def times(op: str, p: str) -> tuple[float, float]:
        parts = [gc.costs[op][p], *(gc.other_costs[f][follow_format(p, gc.backward_precision)]
                                    for f in followers.get(op, ()))]
        return sum(c.fwd_ms + c.weight_cast_ms for c in parts), sum(c.total_ms for c in parts)

    allowed, dropped = {}, {}
    for op, ps in gc.allowed.items():
        t = {p: times(op, p) for p in ps}
        keep = []
        for i, p in enumerate(ps):
            by = next((q for q in ps[:i] if omega[op][q] <= omega[op][p] and t[q][0] <= t[p][0] and t[q][1] < t[p][1]),
                      None)
            if by is None:
                keep.append(p)
            else:
                dropped.setdefault(p, {}).setdefault(by, 0)
                dropped[p][by] += 1
        allowed[op] = tuple(keep)
    if not dropped:
        return gc, ""

    def least_mem(table) -> float:
        return gc.memory.fixed_bytes + sum(min(gc.memory.op_bytes[op][p] for p in ps) for op, ps in table.items())

    what = "; ".join(f"{p} at {sum(by.values())} op(s) (slower than {', '.join(sorted(by))})"
                     for p, by in dropped.items())
    if least_mem(allowed) > gc.mem_capacity_bytes >= least_mem(gc.allowed):
        return gc, (f"{gc.name}: kept {what}, though slower and less accurate: without them the group "
                    "does not fit in memory")
    return (replace(gc, allowed=allowed),
            f"{gc.name}: not offered, slower than a more accurate precision at the same op: {what}")


def _op_time(gc: GroupContext, followers: dict[str, list[str]], op: str, p: str) -> float:
    """The op's own time at p plus its followers' time in the format they take from it."""
    fmt = follow_format(p, gc.backward_precision)
    return gc.costs[op][p].total_ms + sum(gc.other_costs[f][fmt].total_ms for f in followers.get(op, ()))


def _cast_tables(gc: GroupContext) -> dict[tuple[str, str], dict[tuple[str, str], float]]:
    out = {}
    for a, b in gc.graph.selectable_edges:
        n = gc.graph.edge_numel.get((a, b), gc.graph.node(a).output_numel)
        table = {}
        for pa in gc.allowed[a]:
            for pb in gc.allowed[b]:
                t = edge_cast_ms(n, pa, pb, gc.device, gc.backward_precision, gc.boundary)
                if t > 0:
                    table[(pa, pb)] = t
        if table:
            out[(a, b)] = table
    return out


def _local_batches(spec: JobSpec, local_batches: Mapping[str, int] | None) -> dict[str, int]:
    lbs = dict(local_batches) if local_batches is not None else spec.local_batches()
    names = [g.name for g in spec.cluster.groups]
    missing = [n for n in names if n not in lbs]
    if missing:
        raise SpecError(f"local_batches: no batch for group(s) {missing}; give one per group of {names}")
    bad = {n: b for n, b in lbs.items() if not isinstance(b, int) or b < 1}
    if bad:
        raise SpecError(f"local_batches: {bad} are not positive integers; give each group a batch >= 1")
    return lbs


def build_instance(
    spec: JobSpec,
    graph: OpGraph,
    sensitivity: Sensitivity | Mapping[str, Mapping[str, float]],
    *,
    local_batches: Mapping[str, int] | None = None,
    boundary: str = "edge",
    log=None,
) -> tuple[TrainingInstance, Context]:
    """The planning problem for `spec` as plain numbers, and the Context that explains them.

    `boundary`: 'edge' (QSync: casts on edges, non-selectable ops follow their producer) or
    'fp32' (this project's runtime: every op casts in and out; see followers.py).
    """
    if boundary not in BOUNDARIES:
        raise SpecError(f"boundary: got {boundary!r}; use one of {', '.join(BOUNDARIES)}")
    if spec.training is None:
        raise SpecError("training: build_instance needs a training section (kind: training)")
    omega = _omega(sensitivity)
    lbs = _local_batches(spec, local_batches)
    gcs = [_group_context(spec, g, graph, lbs[g.name], boundary, log) for g in spec.cluster.groups]
    link = _link(spec, gcs)
    proto = Context(
        groups=(), world_size=spec.cluster.world_size, link_bandwidth_gbs=link.bandwidth_gbs,
        link_latency_us=link.latency_us, global_batch=spec.training.global_batch,
    )
    notes = []
    ddp = ddp_calibrate(spec, gcs, proto)  # profile_costs.py: the replay brought to the measured DDP step
    if ddp is not None:
        gcs, note = ddp
        notes.append(note)
    highest = {gc.name: replay_group(gc, gc.highest, proto) for gc in gcs}
    fastest = min(t.iteration_ms for t in highest.values())
    roles = {g.name: g.role for g in spec.cluster.groups}
    # QSync's 'auto' bound only means something when accuracy is minimised under a time bound;
    # when time itself is minimised, only groups declared role: training are pinned.
    auto = spec.objective.max_iteration_time == "auto"
    qsync_bound = auto and spec.objective.minimize == "accuracy_degradation"
    training = tuple(
        gc.name for gc in gcs
        if roles[gc.name] == "training"
        or (qsync_bound and roles[gc.name] == "auto"
            and highest[gc.name].iteration_ms <= fastest * (1 + AUTO_TRAINING_SLACK))
    )
    pinned = {gc.name: gc.name in training and (qsync_bound or roles[gc.name] == "training") for gc in gcs}
    gcs = [replace(gc, allowed={op: (ps[0],) for op, ps in gc.allowed.items()}) if pinned[gc.name] else gc
           for gc in gcs]
    for i, gc in enumerate(gcs):  # a precision slower than a more accurate one at the same op is never offered
        if gc.cost_kind == "datasheet":  # (only where the times are measured or calibrated: drop_dominated)
            continue
        _check_omega(omega, gc.name, gc.allowed)
        gcs[i], note = drop_dominated(gc, omega)
        if note:
            notes.append(note)
    rows = lockstep_rows(proto, tuple(gcs))  # lockstep.py: the replayer's synchronised iteration as rows
    if qsync_bound:
        if not training:
            raise SpecError(
                "objective.max_iteration_time: 'auto' needs a training group, but every group is "
                "role: inference; mark one group role: training or give a bound in ms"
            )
        # QSync's bound: the training groups' own iteration, on the lockstep clock (their all-reduces,
        # then every group's optimizer step): the least iteration any plan of the others can reach.
        bound = max(_lockstep_floor(gc, rows[gc.name]) for gc in gcs if gc.name in training)
        own = max(highest[n].iteration_ms for n in training)
        notes.append(f"bound {bound:.3f} ms = the lockstep iteration the training group(s) ({', '.join(training)}) "
                     f"set at their highest precision (their own iteration {own:.3f} ms"
                     + (f", then the slowest optimizer step, {bound - own:+.3f} ms" if bound > own * (1 + 1e-9) else "")
                     + ")")
    elif auto:
        bound = None
        notes.append("no time bound: the objective minimises iteration time under the indicator budget")
    else:
        bound = float(spec.objective.max_iteration_time)
        notes.append(f"bound {bound:.3f} ms from objective.max_iteration_time")

    groups, final = [], []
    for gc in gcs:
        is_training = gc.name in training
        allowed = gc.allowed
        _check_omega(omega, gc.name, allowed)
        g_bound = None if (qsync_bound and is_training) else bound
        gc = replace(gc, allowed=allowed, time_bound_ms=g_bound, role="training" if is_training else "inference")
        final.append(gc)
        followers: dict[str, list[str]] = {}
        for f, own in gc.owner.items():
            if own is not None:
                followers.setdefault(own, []).append(f)
        unowned = sum(gc.other_costs[f]["fp32"].total_ms for f, own in gc.owner.items() if own is None)
        fixed_ms = unowned + gc.optimizer_ms  # the all-reduce is in the bucket rows (sync_rows), exactly
        groups.append(GroupInstance(
            name=gc.name,
            share=gc.count * gc.local_batch / spec.training.global_batch,
            allowed=allowed,
            time_ms={op: {p: _op_time(gc, followers, op, p) for p in ps} for op, ps in allowed.items()},
            mem_bytes={op: {p: gc.memory.op_bytes[op][p] for p in ps} for op, ps in allowed.items()},
            cast_ms=_cast_tables(gc),
            fixed_ms=fixed_ms,
            fixed_mem_bytes=gc.memory.fixed_bytes,
            time_bound_ms=g_bound,
            mem_capacity_bytes=gc.mem_capacity_bytes,
            sync_rows=rows[gc.name],
        ))
    if spec.runtime.backward_precision == "fp8":
        notes.append(fp8_backward_note(final))
    ops = {op for g in groups for op in g.allowed}
    instance = TrainingInstance(
        groups=tuple(groups),
        omega={op: dict(omega[op]) for op in ops},
        objective=spec.objective.minimize,
        max_degradation=spec.objective.max_accuracy_degradation,
    )
    ctx = Context(
        groups=tuple(final), world_size=proto.world_size, link_bandwidth_gbs=link.bandwidth_gbs,
        link_latency_us=link.latency_us, global_batch=spec.training.global_batch,
        time_bound_ms=bound, training_groups=training, cost_source=_source(final),
        notes=tuple(notes + [f"costs of {gc.name}: {gc.cost_source}" for gc in final]),
    )
    return instance, ctx


def fp8_backward_note(gcs) -> str:
    """What runtime.backward_precision 'fp8' does in these groups: which may run fp8 linears with fp8 gradients."""
    takers = [gc.name for gc in gcs if any(fp8_grads(gc.graph.node(op).kind, p, "fp8")
                                           for op, ps in gc.allowed.items() for p in ps)]
    rest = "/".join(sorted({gc.backward_precision for gc in gcs}))  # each group's resolved 16-bit format
    if not takers:
        runs = [gc.name for gc in gcs if gc.device.backward_format("fp8") == "fp8"]
        why = (f"{', '.join(runs)} run(s) fp8, but no linear is offered an fp8 format there (see the notes on what is "
               "not offered)" if runs else f"no group's device runs fp8 (sm_{FP8_SM}+)")
        return f"runtime.backward_precision fp8 changes no op here: {why}; every quantized op's backward runs in {rest}"
    return (f"runtime.backward_precision fp8: fp8 linears of {', '.join(takers)} run both backward GEMMs in fp8 "
            f"(e5m2 gradients); every other quantized op's backward runs in {rest}")


def _lockstep_floor(gc: GroupContext, rows) -> float:
    """The largest of a pinned group's rows (main and bucket rows) at its highest precision."""
    choice = gc.highest
    main = _main_row(gc, choice)
    return max([main, *(row_ms(r, choice) for r in rows)])


def _main_row(gc: GroupContext, choice) -> float:
    """F + B + optimizer of `choice`: the replayer's own figures (compute_ms)."""
    return replay_group(gc, choice, Context(groups=(), world_size=1, link_bandwidth_gbs=1.0, link_latency_us=0.0,
                                            global_batch=1)).compute_ms


def _source(gcs) -> str:
    kinds = {"measured" if gc.cost_source.startswith("measured") else "roofline" for gc in gcs}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _link(spec: JobSpec, gcs):
    """The spec's interconnect, or the profile's measured all-reduce when every group was measured here."""
    link = spec.cluster.link
    if gcs and all(gc.cost_source.startswith("measured") for gc in gcs):
        fit = measured_link(spec, profile_for(spec.cluster.groups[0]))
        if fit is not None:
            return link.model_copy(update={"bandwidth_gbs": fit[0], "latency_us": fit[1]})
    return link


BASELINES = ("highest", "lowest")


def baseline(instance: TrainingInstance, kind: str) -> Assignment:
    """'highest': every op at its group's highest allowed precision (fp32 where allowed);
    'lowest': every op at its group's lowest allowed precision (uniform low precision)."""
    if kind not in BASELINES:
        raise SpecError(f"baseline kind: got {kind!r}; use one of {', '.join(BASELINES)}")
    idx = 0 if kind == "highest" else -1
    return {g.name: {op: ps[idx] for op, ps in g.allowed.items()} for g in instance.groups}
