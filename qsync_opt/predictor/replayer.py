"""The replayer: an assignment played out on a timeline, the judge of a plan.

The iteration time is the lockstep one: every rank joins each bucket's ring all-reduce, so
a bucket starts only when the slowest group has its gradients; a faster group idles. Per
group it reports compute, casts, its own exposed all-reduce (as if every rank were like
it) and the idle time waiting for stragglers, which add up to the lockstep iteration.

Per group: forward ops in graph order (edge casts before an op, weight casts with it,
non-selectable ops in the format of the op they follow), backward in reverse (gradient casts
after an op), DDP bucket all-reduces overlapping backward,
then the optimizer step. The linear model in the TrainingInstance is exact except for the
exposed all-reduce, which it estimates once at the group's highest precision; the replayer
re-simulates it for the assignment in hand, so the solver's verify-and-refine loop calls
`verify` to learn whether a bound really holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from qsync_opt.errors import SpecError
from qsync_opt.predictor.casts import edge_cast_parts
from qsync_opt.predictor.comm import CommTimeline, allreduce_ms, simulate_allreduce
from qsync_opt.predictor.context import Context, GroupContext
from qsync_opt.predictor.followers import follow_format


@dataclass(frozen=True)
class GroupTimeline:
    """One group's iteration, in ms (memory in bytes per device)."""

    group: str
    forward_ms: float
    """Forward kernels + weight casts + forward edge casts."""
    backward_ms: float
    """Backward kernels + gradient edge casts."""
    cast_ms: float
    """Edge casts, forward and backward (already inside forward_ms and backward_ms)."""
    weight_cast_ms: float
    """Master-weight casts (already inside forward_ms)."""
    optimizer_ms: float
    compute_ms: float
    """forward + backward + optimizer."""
    comm_ms: float
    """All bucket all-reduces, overlapped or not."""
    comm_exposed_ms: float
    iteration_ms: float
    """compute_ms + comm_exposed_ms."""
    peak_memory_bytes: float
    grad_ready_ms: dict[str, float]
    """op -> when its weight gradient exists, from the start of backward."""
    comm: CommTimeline
    events: tuple[tuple[str, str, float, float], ...] = ()
    """(phase, name, start ms, duration ms) of every compute step, from the iteration's start;
    phase is 'forward', 'backward', 'cast' or 'optimizer'."""


@dataclass(frozen=True)
class Timeline:
    groups: dict[str, GroupTimeline]
    sync_iteration_ms: float
    """All groups in lockstep: each bucket's all-reduce waits for the slowest group's gradients."""
    idle_ms: dict[str, float] = field(default_factory=dict)
    """group -> time spent waiting for stragglers: lockstep iteration − (own compute + own exposed comm)."""
    bucket_starts: tuple[float, ...] = ()
    """Lockstep all-reduce of each bucket, from the iteration's start (every rank takes part)."""
    bucket_ends: tuple[float, ...] = ()

    @property
    def iteration_ms(self) -> float:
        """The iteration time: the lockstep one (a ring cannot start before every rank is ready)."""
        return self.sync_iteration_ms


def _check_choice(g: GroupContext, choice: Mapping[str, str]) -> None:
    missing = [op for op in g.costs if op not in choice]
    if missing:
        raise SpecError(
            f"assignment[{g.name!r}]: no precision for {len(missing)} op(s), e.g. {missing[:3]}; "
            "give every selectable op a precision"
        )
    for op, p in choice.items():
        if op not in g.costs:
            raise SpecError(f"assignment[{g.name!r}]: {op!r} is not a selectable op of the graph")
        if p not in g.costs[op]:
            raise SpecError(
                f"assignment[{g.name!r}][{op!r}]: {p!r} does not run on {g.device.name}; "
                f"use one of {list(g.costs[op])}"
            )


def replay_group(g: GroupContext, choice: Mapping[str, str], ctx: Context) -> GroupTimeline:
    """Play one group's iteration with selectable ops at `choice[op]`."""
    _check_choice(g, choice)
    graph = g.graph
    in_edges: dict[str, list[tuple[str, str]]] = {}
    for a, b in graph.selectable_edges:
        in_edges.setdefault(b, []).append((a, b))

    def casts(edge: tuple[str, str]) -> tuple[float, float]:
        n = graph.edge_numel.get(edge)
        if n is None:
            n = graph.node(edge[0]).output_numel
        return edge_cast_parts(n, choice[edge[0]], choice[edge[1]], g.device, g.backward_precision, g.boundary)

    def other(name: str):
        own = g.owner.get(name)
        return g.other_costs[name][follow_format(choice[own] if own else None, g.backward_precision)]

    events: list[tuple[str, str, float, float]] = []
    fwd = wcast = fcast = 0.0
    clock = 0.0
    for node in graph.nodes:
        if node.selectable:
            cost = g.costs[node.name][choice[node.name]]
            c = sum(casts(e)[0] for e in in_edges.get(node.name, ()))
            if c:
                events.append(("cast", f"cast->{node.name}", clock, c))
            fcast += c
            wcast += cost.weight_cast_ms
            fwd += cost.fwd_ms
            step = c + cost.weight_cast_ms + cost.fwd_ms
            events.append(("forward", f"{node.name} [{choice[node.name]}]", clock + c, step - c))
        else:
            step = other(node.name).fwd_ms
            fwd += step
            events.append(("forward", node.name, clock, step))
        clock += step
    forward = fwd + wcast + fcast

    t, bcast, ready = 0.0, 0.0, {}
    for node in reversed(graph.nodes):
        if node.selectable:
            d = g.costs[node.name][choice[node.name]].bwd_ms
            events.append(("backward", f"{node.name} [{choice[node.name]}]", forward + t, d))
            t += d
            ready[node.name] = t
            for e in in_edges.get(node.name, ()):
                c = casts(e)[1]
                if c:
                    events.append(("cast", f"grad cast {e[1]}->{e[0]}", forward + t, c))
                bcast += c
                t += c
        else:
            d = other(node.name).bwd_ms
            events.append(("backward", node.name, forward + t, d))
            t += d
            ready[node.name] = t
    backward = t
    events.append(("optimizer", "optimizer step", forward + backward, g.optimizer_ms))

    comm = simulate_allreduce(
        g.buckets, ready, backward, ctx.world_size, ctx.link_bandwidth_gbs, ctx.link_latency_us
    )
    compute = forward + backward + g.optimizer_ms
    return GroupTimeline(
        group=g.name,
        forward_ms=forward,
        backward_ms=backward,
        cast_ms=fcast + bcast,
        weight_cast_ms=wcast,
        optimizer_ms=g.optimizer_ms,
        compute_ms=compute,
        comm_ms=comm.total_ms,
        comm_exposed_ms=comm.exposed_ms,
        iteration_ms=compute + comm.exposed_ms,
        peak_memory_bytes=g.memory.total(choice),
        grad_ready_ms=ready,
        comm=comm,
        events=tuple(events),
    )


def _sync(ctx: Context, tls: dict[str, GroupTimeline]) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
    """Lockstep: bucket k starts when every group has its gradients and bucket k−1 is done;
    a group steps its optimizer after its backward and the last all-reduce. Returns the
    iteration (the last group's end) and the buckets' starts and ends."""
    first = ctx.groups[0]
    prev_end, starts, ends = 0.0, [], []
    for b in first.buckets:
        ready = max(tls[g.name].forward_ms + max(tls[g.name].grad_ready_ms[op] for op in b.ops) for g in ctx.groups)
        start = max(ready, prev_end)
        prev_end = start + allreduce_ms(b.nbytes, ctx.world_size, ctx.link_bandwidth_gbs, ctx.link_latency_us)
        starts.append(start)
        ends.append(prev_end)
    end = 0.0
    for g in ctx.groups:
        tl = tls[g.name]
        end = max(end, max(tl.forward_ms + tl.backward_ms, prev_end) + tl.optimizer_ms)
    return end, tuple(starts), tuple(ends)


def replay(ctx: Context, assignment: Mapping[str, Mapping[str, str]]) -> Timeline:
    """Every group's timeline for `assignment` (group -> op -> precision)."""
    unknown = set(assignment) - {g.name for g in ctx.groups}
    if unknown:
        raise SpecError(
            f"assignment: unknown group(s) {sorted(unknown)}; groups are {[g.name for g in ctx.groups]}"
        )
    tls = {}
    for g in ctx.groups:
        if g.name not in assignment:
            raise SpecError(f"assignment: group {g.name!r} is missing; give it an op -> precision map")
        tls[g.name] = replay_group(g, assignment[g.name], ctx)
    it, starts, ends = _sync(ctx, tls)
    idle = {n: max(0.0, it - t.compute_ms - t.comm_exposed_ms) for n, t in tls.items()}
    return Timeline(tls, it, idle, starts, ends)


def verify(ctx: Context, assignment: Mapping[str, Mapping[str, str]]) -> dict[str, float]:
    """group -> predicted iteration ms of `assignment` (compute + exposed all-reduce)."""
    return {name: tl.iteration_ms for name, tl in replay(ctx, assignment).groups.items()}
