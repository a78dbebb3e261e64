"""Non-selectable ops follow the precision of the selectable op that feeds them.

Two runtime models of where precision changes (`boundary`):

- "edge" (QSync, DESIGN.md): activations travel in their producer's format; a cast is paid on a
  selectable edge whose ends differ. Norms, activations, adds and pools run in the format of
  their *owner*: the latest selectable op (in graph order) whose output reaches them through
  non-selectable ops only. Integer/fp8 owners hand on 16-bit tensors (their epilogue
  dequantises into the backward precision), so followers never go below 16 bits, as QSync's
  runtime (BatchNorm never below fp16). Ops no selectable op feeds stay at fp32.
- "fp32" (this project's runtime, runtime/qfunctions.py: "every operator returns fp32"):
  each selectable op casts its input in and its output back to fp32 itself, so there are no
  edge casts and every non-selectable op runs at fp32.

A follower's cost and saved activations are then a function of its owner's precision, which
keeps the planner's model linear: they are added to the owner's per-precision entries.
"""

from __future__ import annotations

from typing import Literal

from qsync_opt.hardware.device import DeviceSpec
from qsync_opt.models.graph import OpGraph, OpNode
from qsync_opt.precision import BITS
from qsync_opt.predictor.casts import activation_format
from qsync_opt.predictor.costs import OpCost, fixed_cost

Boundary = Literal["edge", "fp32"]
BOUNDARIES: tuple[str, ...] = ("edge", "fp32")
#: Formats a follower can run in.
FOLLOW_FORMATS: tuple[str, ...] = ("fp32", "bf16", "fp16")
#: Saved tensors that are not activations (masks) and do not shrink with the format.
UNSCALED_SAVES = frozenset({"dropout"})


def owners(graph: OpGraph, boundary: Boundary = "edge") -> dict[str, str | None]:
    """Non-selectable op -> the selectable op whose precision it follows (None: fp32)."""
    if boundary == "fp32":
        return {n.name: None for n in graph.fixed}
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    preds: dict[str, list[str]] = {}
    for a, b in graph.edges:
        preds.setdefault(b, []).append(a)
    source: dict[str, str | None] = {}  # op -> selectable op its output carries the format of
    out: dict[str, str | None] = {}
    for n in graph.nodes:
        if n.selectable:
            source[n.name] = n.name
            continue
        cands = [source[p] for p in preds.get(n.name, ()) if source.get(p) is not None]
        owner = max(cands, key=order.__getitem__) if cands else None
        source[n.name] = owner
        out[n.name] = owner
    return out


def follow_format(owner_precision: str | None, backward_precision: str) -> str:
    """Format a follower runs in when its owner runs at `owner_precision` (None: fp32)."""
    return "fp32" if owner_precision is None else activation_format(owner_precision, backward_precision)


def follower_cost(node: OpNode, fmt: str, device: DeviceSpec) -> OpCost:
    """A non-selectable op running in format `fmt` (memory-bound; bytes scale with the element)."""
    return fixed_cost(node, device, elem_bytes=BITS[fmt] / 8)


def follower_costs(graph: OpGraph, device: DeviceSpec, owner: dict[str, str | None]) -> dict[str, dict[str, OpCost]]:
    """Non-selectable op -> format -> cost; only fp32 for ops without an owner."""
    return {
        n.name: {f: follower_cost(n, f, device) for f in (FOLLOW_FORMATS if owner.get(n.name) else ("fp32",))}
        for n in graph.fixed
    }


def follower_saved_bytes(node: OpNode, fmt: str) -> float:
    """Bytes a follower saves for backward when it runs in `fmt` (floored at 16 bits by the formats)."""
    if node.kind in UNSCALED_SAVES:
        return float(node.saved_bytes)
    return node.saved_bytes * BITS[fmt] / 32
