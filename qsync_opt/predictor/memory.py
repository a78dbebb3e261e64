"""Peak memory per device: what every plan pays, and what each operator's precision adds.

Peak training memory is reached at the end of the forward pass, when every activation saved
for backward is alive. It is split the way the integer program needs it:

fixed (no choice changes it)
  - FP32 master weights and their gradients: 4 + 4 bytes per parameter;
  - optimizer state: sgd 0, momentum 4, adam/adamw 8 bytes per parameter;
  - DDP gradient buckets when there is more than one rank: another 4 bytes per parameter
    (DDP copies gradients into flat buckets unless gradient_as_bucket_view is set);
  - activations saved by non-selectable ops that follow no selectable op, at FP32;
  - workspace: twice the largest FP32 operator output (the gradient being read and the one
    being written during backward, plus library scratch), a documented constant rule.
per operator and precision (widths are what the runtime stores: kernels.dispatch.storage_bits,
so int4 codes count 8 bits, as they live in int8 tensors)
  - saved activations at bits(p)/32 of their FP32 size (embedding saves int64 indices, which
    do not shrink);
  - the low-precision weight copy, bits(p)/8 per parameter, for formats not stored as fp32;
  - the activations its followers save (followers.py), in the format they run in at p
    (fp32 for fp32/tf32, else 16-bit: never below 16 bits).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from qsync_opt.errors import SpecError
from qsync_opt.models.graph import OpGraph, OpNode
from qsync_opt.kernels.dispatch import storage_bits
from qsync_opt.predictor.casts import storage_format
from qsync_opt.predictor.costs import OPTIMIZER_STATES
from qsync_opt.predictor.followers import follow_format, follower_saved_bytes

#: Bytes of usable memory a device loses to the framework (CUDA context, allocator slack).
RUNTIME_OVERHEAD_BYTES = {"gpu": 0.5e9, "cpu": 0.5e9}
#: Fraction of device memory the planner lets a plan use (LLM-PQ uses the same 0.95).
USABLE_FRACTION = 0.95


@dataclass(frozen=True)
class MemoryModel:
    """Bytes per device: a fixed part (with its breakdown) and op -> precision -> bytes."""

    fixed_bytes: float
    breakdown: dict[str, float]
    op_bytes: dict[str, dict[str, float]] = field(default_factory=dict)

    def total(self, choice: Mapping[str, str]) -> float:
        """Peak bytes with each op at `choice[op]`."""
        return self.fixed_bytes + sum(self.op_bytes[op][choice[op]] for op in self.op_bytes)


def op_memory_bytes(node: OpNode, precision: str) -> float:
    """Saved activations at the op's precision plus its low-precision weight copy."""
    bits = storage_bits(precision)
    saved = node.saved_bytes if node.kind == "embedding" else node.saved_bytes * bits / 32
    weight = node.param_count * bits / 8 if storage_format(precision) != "fp32" else 0.0
    return saved + weight


def workspace_bytes(graph: OpGraph) -> float:
    return 2 * 4 * max((n.output_numel for n in graph.nodes), default=0)


def memory_model(
    graph: OpGraph,
    precisions: Iterable[str] | Mapping[str, Iterable[str]],
    optimizer: str,
    *,
    world_size: int = 1,
    owner: Mapping[str, str | None] | None = None,
    backward_precision: str = "bf16",
) -> MemoryModel:
    """The memory model of `graph` (already at the device's local batch).

    `precisions`: one list for every selectable op, or op -> list. `owner` (followers.owners)
    moves the saved activations of non-selectable ops onto the op whose format they follow;
    without it they count at fp32 in the fixed part. `backward_precision` must be resolved
    for the device (casts.resolve_backward_precision).
    """
    if optimizer not in OPTIMIZER_STATES:
        raise SpecError(
            f"training.optimizer: {optimizer!r} is not known; use one of {', '.join(OPTIMIZER_STATES)}"
        )
    per_op = precisions if isinstance(precisions, Mapping) else None
    shared = None if per_op is not None else tuple(precisions)
    n_params = graph.param_count
    breakdown = {
        "master_weights": 4.0 * n_params,
        "gradients": 4.0 * n_params,
        "optimizer_state": 4.0 * OPTIMIZER_STATES[optimizer] * n_params,
        "ddp_buckets": 4.0 * n_params if world_size > 1 else 0.0,
        "fixed_activations": float(sum(n.saved_bytes for n in graph.fixed if not owner or owner.get(n.name) is None)),
        "workspace": float(workspace_bytes(graph)),
    }
    followers: dict[str, list[OpNode]] = {}
    for n in graph.fixed:
        if owner and owner.get(n.name) is not None:
            followers.setdefault(owner[n.name], []).append(n)

    def op_total(n: OpNode, p: str) -> float:
        fmt = follow_format(p, backward_precision)
        return op_memory_bytes(n, p) + sum(follower_saved_bytes(f, fmt) for f in followers.get(n.name, ()))

    op_bytes = {
        n.name: {p: op_total(n, p) for p in (per_op[n.name] if per_op is not None else shared)}
        for n in graph.selectable
    }
    return MemoryModel(sum(breakdown.values()), breakdown, op_bytes)


def capacity_bytes(memory_bytes: float, kind: str = "gpu") -> float:
    """Usable bytes of a device with `memory_bytes`: 95% of it less the runtime's overhead."""
    return memory_bytes * USABLE_FRACTION - RUNTIME_OVERHEAD_BYTES.get(kind, 0.5e9)
