"""Sensitivity: ω[op][precision], the indicator the planner minimises, and the rules both
indicators share (depth loading and normalisation).

Depth loading (QSync): ω(p) = γ·(L − d)·F(p) + d·B(p), γ = 4, where F is the forward error
an op injects at precision p, B its backward error, d the op's breadth-first depth in the
forward graph and L the graph's total depth. Forward error travels through the L − d levels
downstream of the op; backward error through the d levels upstream. Depth always comes from
the graph (QSync's CNN script left it out, which silently zeroes the indicator).

Normalisation: ω is divided by one constant per indicator so that the sum over all ops at the
*reference* precision (the lowest precision the indicator was asked for) is 1.0. So
"degradation 0.1" reads "a tenth of running every op at the lowest format", whatever the
method, and the raw value is ω × `scale`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from qsync_opt.errors import SpecError
from qsync_opt.models.graph import OpGraph
from qsync_opt.precision import PRECISIONS, sort_high_to_low

GAMMA = 4.0


@dataclass(frozen=True)
class Sensitivity:
    """op -> precision -> normalised indicator (0 at fp32), and how it was obtained."""

    omega: dict[str, dict[str, float]]
    method: str
    """'weight' or 'gvar'."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    scale: float = 1.0
    """Raw indicator = omega × scale."""
    reference: str = ""
    """The precision at which Σ_ops ω = 1."""

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "notes": list(self.notes),
            "scale": self.scale,
            "reference": self.reference,
            "omega": {op: dict(v) for op, v in self.omega.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "Sensitivity":
        return cls(
            omega={op: {p: float(x) for p, x in v.items()} for op, v in d["omega"].items()},
            method=d["method"],
            notes=tuple(d.get("notes", ())),
            scale=float(d.get("scale", 1.0)),
            reference=d.get("reference", ""),
        )


def check_precisions(precisions: Iterable[str]) -> tuple[str, ...]:
    ps = tuple(precisions)
    if not ps:
        raise SpecError("precisions: got an empty list; give at least one format, e.g. ['fp32', 'int8']")
    bad = [p for p in ps if p not in PRECISIONS]
    if bad:
        raise SpecError(f"precisions: unknown {bad}; known: {', '.join(PRECISIONS)}")
    return sort_high_to_low(ps)


def total_depth(graph: OpGraph) -> int:
    """L: the graph's depth, or one more than its deepest op when the graph does not say."""
    deepest = max((n.depth for n in graph.nodes), default=-1) + 1
    return max(graph.depth, deepest)


def depth_loading(graph: OpGraph, gamma: float = GAMMA) -> dict[str, tuple[float, float]]:
    """op -> (weight of F, weight of B) = (γ·(L − d), d) for every selectable op."""
    L = total_depth(graph)
    return {n.name: (gamma * (L - n.depth), float(n.depth)) for n in graph.selectable}


def normalise(raw: Mapping[str, Mapping[str, float]], precisions: tuple[str, ...]) -> tuple[dict, float, str]:
    """(omega, scale, reference): raw / scale with Σ_ops raw[op][reference] = scale."""
    reference = precisions[-1]
    scale = sum(v[reference] for v in raw.values())
    if scale <= 0:
        scale = 1.0
    omega = {op: {p: x / scale for p, x in v.items()} for op, v in raw.items()}
    return omega, scale, reference
