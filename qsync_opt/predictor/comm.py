"""Gradient all-reduce: α–β ring cost, DDP bucketing, and the part backward does not hide.

A ring all-reduce of B bytes over n ranks moves 2(n−1)/n·B bytes through the slowest link
and pays 2(n−1) hop latencies. Gradients are FP32. DDP groups them into ~25 MiB buckets in
reverse parameter order (the order backward produces them); a bucket's all-reduce starts once
its last gradient is ready and the previous bucket's all-reduce is done, so communication
overlaps the rest of backward, and only what runs past the end of backward is exposed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from qsync_opt.errors import SpecError
from qsync_opt.models.graph import OpGraph

DEFAULT_BUCKET_MB = 25.0  # torch DDP bucket_cap_mb (MiB)
FIRST_BUCKET_MB = 1.0  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: DDP's first bucket is small


@dataclass(frozen=True)
class Bucket:
    ops: tuple[str, ...]
    """Ops whose FP32 gradients share this bucket, in the order backward produces them."""
    nbytes: int


@dataclass(frozen=True)
class CommTimeline:
    """Bucket all-reduces on one backward timeline (ms from the start of backward)."""

    starts: tuple[float, ...]
    ends: tuple[float, ...]
    total_ms: float
    """Sum of all-reduce durations."""
    exposed_ms: float
    """max(0, end of last all-reduce − end of backward)."""


def allreduce_ms(nbytes: float, world_size: int, bandwidth_gbs: float, latency_us: float) -> float:
    """Ring all-reduce time: 2(n−1)/n · bytes / bandwidth + 2(n−1) · latency. 0 for one rank."""
    if world_size < 1:
        raise SpecError(f"world_size: got {world_size}; a cluster has at least one device")
    if bandwidth_gbs <= 0:
        raise SpecError(f"cluster.interconnect.bandwidth_gbs: got {bandwidth_gbs}; give a positive GB/s")
    n = world_size
    if n == 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / (bandwidth_gbs * 1e6) + 2 * (n - 1) * latency_us / 1e3


def ddp_buckets(graph: OpGraph, bucket_mb: float = DEFAULT_BUCKET_MB,
                first_bucket_mb: float = FIRST_BUCKET_MB) -> tuple[Bucket, ...]:
    """FP32 gradient buckets in reverse parameter order (graph order stands for registration
    order); an op's parameters stay together, a bucket closes once it reaches its cap (an op
    larger than the cap gets its own). As DDP's reducer after its first step, the first bucket's
    cap is `first_bucket_mb` (1 MiB, never above `bucket_mb`), so all-reduce starts early."""
    if bucket_mb <= 0:
        raise SpecError(f"bucket_mb: got {bucket_mb}; give a positive size in MiB (DDP default 25)")
    cap = bucket_mb * 1024 * 1024
    first = min(first_bucket_mb * 1024 * 1024, cap)
    buckets: list[Bucket] = []
    ops: list[str] = []
    size = 0
    for node in reversed(graph.nodes):
        if not node.param_count:
            continue
        ops.append(node.name)
        size += 4 * node.param_count
        if size >= (cap if buckets else first):
            buckets.append(Bucket(tuple(ops), size))
            ops, size = [], 0
    if ops:
        buckets.append(Bucket(tuple(ops), size))
    return tuple(buckets)


def simulate_allreduce(
    buckets: tuple[Bucket, ...],
    grad_ready_ms: Mapping[str, float],
    backward_end_ms: float,
    world_size: int,
    bandwidth_gbs: float,
    latency_us: float,
) -> CommTimeline:
    """Bucket all-reduces on a backward timeline; `grad_ready_ms[op]` = when op's weight
    gradient exists (end of its backward), measured from the start of backward."""
    starts, ends = [], []
    prev_end, total = 0.0, 0.0
    for b in buckets:
        ready = max(grad_ready_ms[op] for op in b.ops)
        dur = allreduce_ms(b.nbytes, world_size, bandwidth_gbs, latency_us)
        start = max(ready, prev_end)
        starts.append(start)
        ends.append(start + dur)
        prev_end = start + dur
        total += dur
    last = ends[-1] if ends else 0.0
    exposed = max(0.0, last - backward_end_ms) if total > 0 else 0.0
    return CommTimeline(tuple(starts), tuple(ends), total, exposed)
