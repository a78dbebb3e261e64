"""The replayer's lockstep iteration as linear rows of each group's choices: the program's time constraint.

The replayer (`replayer._sync`) plays every group on one clock: bucket k's all-reduce starts
when every group has bucket k's gradients and bucket k−1's all-reduce is done; a group steps
its optimizer after its own backward and the last all-reduce. Unrolled, with F_g the group's
forward, R_gk its backward up to bucket k's last gradient, B_g its whole backward, o_g its
optimizer step, A_j bucket j's all-reduce and O = max_g o_g,

    iteration = max( max_g (F_g + B_g + o_g),  max_{g,k} (F_g + R_gk) + Σ_{j≥k} A_j + O ).

Each term inside the max depends on one group's choices only, and is linear in them: an op's
forward, weight cast and (when it falls before bucket k's last gradient) backward, those of the
non-selectable ops that follow its format, and the edge casts (the forward part always, the
gradient part when the cast runs before that gradient). So "iteration ≤ bound" is exactly one
row per term, and the iteration is the largest row. That needs every duration ≥ 0 (so a
bucket's last gradient is always the one of its op nearest the graph's input) and A_j
independent of the plan (gradients are all-reduced in fp32): both hold for the costs here.

The group's own row F_g + B_g + o_g is the instance's main row (time_ms, cast_ms, fixed_ms);
the bucket terms become its `sync_rows`.
"""

from __future__ import annotations

from qsync_opt.training.program.instance import TimeRow
from qsync_opt.training.predictor.casts import edge_cast_parts
from qsync_opt.training.predictor.comm import allreduce_ms
from qsync_opt.training.predictor.context import Context, GroupContext
from qsync_opt.training.predictor.followers import follow_format


def allreduce_tails(ctx: Context, groups: tuple[GroupContext, ...]) -> list[float]:
    """Σ_{j≥k} A_j for each bucket k (the buckets of the first group, as the replayer uses)."""
    durs = [allreduce_ms(b.nbytes, ctx.world_size, ctx.link_bandwidth_gbs, ctx.link_latency_us)
            for b in groups[0].buckets]
    return [sum(durs[k:]) for k in range(len(durs))]


def bucket_rows(gc: GroupContext, tails: list[float], slowest_optimizer_ms: float,
                buckets=None) -> tuple[TimeRow, ...]:
    """One TimeRow per bucket: F + R_k + Σ_{j≥k} A_j + O, over the precisions in gc.allowed."""
    graph = gc.graph
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    followers: dict[str, list[str]] = {}
    unowned = []
    for f, own in gc.owner.items():
        (followers.setdefault(own, []) if own is not None else unowned).append(f)
    fmt = lambda p: follow_format(p, gc.backward_precision)  # noqa: E731
    rows = []
    for k, b in enumerate(buckets if buckets is not None else gc.buckets):
        first = min(index[op] for op in b.ops)  # backward reaches it last: its gradient closes the bucket

        def part(cost, i):  # forward always; backward when it runs before the bucket closes
            return cost.fwd_ms + cost.weight_cast_ms + (cost.bwd_ms if i >= first else 0.0)

        op_ms = {}
        for op, ps in gc.allowed.items():
            op_ms[op] = {p: part(gc.costs[op][p], index[op])
                         + sum(part(gc.other_costs[f][fmt(p)], index[f]) for f in followers.get(op, ()))
                         for p in ps}
        const = sum(part(gc.other_costs[f]["fp32"], index[f]) for f in unowned)
        cast_ms = {}
        for a, bb in graph.selectable_edges:
            n = graph.edge_numel.get((a, bb))
            if n is None:
                n = graph.node(a).output_numel
            table = {}
            for pa in gc.allowed[a]:
                for pb in gc.allowed[bb]:
                    fwd, bwd = edge_cast_parts(n, pa, pb, gc.device, gc.backward_precision, gc.boundary)
                    t = fwd + (bwd if index[bb] > first else 0.0)  # the gradient cast runs after bb's backward
                    if t > 0:
                        table[(pa, pb)] = t
            if table:
                cast_ms[(a, bb)] = table
        rows.append(TimeRow(name=f"bucket {k}", op_ms=op_ms, cast_ms=cast_ms,
                            const_ms=const + tails[k] + slowest_optimizer_ms))
    return tuple(rows)


def lockstep_rows(ctx: Context, groups: tuple[GroupContext, ...]) -> dict[str, tuple[TimeRow, ...]]:
    """group -> its bucket rows, on the clock every group shares (module docstring)."""
    tails = allreduce_tails(ctx, groups)
    slowest = max(gc.optimizer_ms for gc in groups)
    return {gc.name: bucket_rows(gc, tails, slowest, groups[0].buckets) for gc in groups}
