"""TrainingInstance: the planning problem as plain numbers, before any solver sees it.

The predictor fills one from a spec (costs, memory, indicator); the compiler turns it into
a backend-neutral Problem; the greedy allocator and the brute-force checker work on it
directly. `evaluate` recomputes an assignment's times, memory and objective from the
instance alone, so every solver's answer can be checked independently of that solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

Assignment = dict[str, dict[str, str]]
"""group name -> op FQN -> precision."""


@dataclass(frozen=True)
class TimeRow:
    """One more linear term of the lockstep iteration that this group's choices set (predictor/lockstep.py):
    const_ms + Σ_op op_ms[op][p(op)] + Σ_edge cast_ms[edge][(p(a), p(b))]; a missing entry counts 0.

    E.g. "bucket k": the group's forward, its backward up to bucket k's gradients, then every
    all-reduce from k on and the slowest optimizer step. The iteration is the largest of all
    groups' rows (the main one included), so each row must meet the group's time bound."""

    name: str
    op_ms: dict[str, dict[str, float]]
    cast_ms: dict[tuple[str, str], dict[tuple[str, str], float]] = field(default_factory=dict)
    const_ms: float = 0.0


@dataclass(frozen=True)
class GroupInstance:
    """One device group's costs. All times in ms per iteration, memory in bytes per device."""

    name: str
    share: float
    """Fraction of the global batch this group processes (weights its indicator)."""
    allowed: dict[str, tuple[str, ...]]
    """op -> precisions this group may run it at, highest first."""
    time_ms: dict[str, dict[str, float]]
    """op -> precision -> forward+backward time, weight casts included."""
    mem_bytes: dict[str, dict[str, float]]
    """op -> precision -> bytes that depend on the op's precision (saved activations, weight copy)."""
    cast_ms: dict[tuple[str, str], dict[tuple[str, str], float]] = field(default_factory=dict)
    """edge (a, b) -> (precision of a, precision of b) -> cast time; a missing pair costs 0."""
    fixed_ms: float = 0.0
    """Time that no choice changes: non-selectable ops, optimizer step, exposed all-reduce."""
    fixed_mem_bytes: float = 0.0
    """Memory that no choice changes: FP32 master weights, gradients, optimizer state, workspace."""
    time_bound_ms: float | None = None
    """Synchronisation bound (None: unconstrained, e.g. the training groups themselves)."""
    mem_capacity_bytes: float = math.inf
    sync_rows: tuple[TimeRow, ...] = ()
    """Further rows of the lockstep iteration (empty: the main row alone is the group's time).
    The group's time is the largest of its rows; time_bound_ms bounds each."""

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(self.allowed)


@dataclass(frozen=True)
class TrainingInstance:
    groups: tuple[GroupInstance, ...]
    omega: dict[str, dict[str, float]]
    """op -> precision -> indicator (accuracy-degradation estimate); 0 at fp32."""
    objective: Literal["accuracy_degradation", "iteration_time"] = "accuracy_degradation"
    max_degradation: float | None = None
    """Budget on the share-weighted indicator sum, for objective == iteration_time."""

    def group(self, name: str) -> GroupInstance:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)


@dataclass(frozen=True)
class Evaluation:
    time_ms: dict[str, float]
    mem_bytes: dict[str, float]
    degradation: float
    """Σ_g share_g · Σ_i ω[i, p_g(i)]."""
    iteration_ms: float
    """Slowest group's time (the largest row of any group): what synchronous data parallelism waits for."""
    violations: list[str]

    @property
    def feasible(self) -> bool:
        return not self.violations

    def objective(self, instance: TrainingInstance) -> float:
        return self.degradation if instance.objective == "accuracy_degradation" else self.iteration_ms


def main_row_ms(g: GroupInstance, choice: dict[str, str]) -> float:
    """The group's own row: fixed + op times + casts (without its sync rows)."""
    t = g.fixed_ms + sum(g.time_ms[op][choice[op]] for op in g.allowed)
    for (a, b), table in g.cast_ms.items():
        t += table.get((choice[a], choice[b]), 0.0)
    return t


def row_ms(row: TimeRow, choice: dict[str, str]) -> float:
    t = row.const_ms + sum(table.get(choice[op], 0.0) for op, table in row.op_ms.items())
    for (a, b), table in row.cast_ms.items():
        t += table.get((choice[a], choice[b]), 0.0)
    return t


def group_time_ms(g: GroupInstance, choice: dict[str, str]) -> float:
    """The group's time: the largest of its main row and its sync rows."""
    t = main_row_ms(g, choice)
    return max([t, *(row_ms(r, choice) for r in g.sync_rows)])


def group_mem_bytes(g: GroupInstance, choice: dict[str, str]) -> float:
    return g.fixed_mem_bytes + sum(g.mem_bytes[op][choice[op]] for op in g.allowed)


def evaluate(instance: TrainingInstance, assignment: Assignment, rel_tol: float = 1e-6) -> Evaluation:
    """Times, memory, degradation and bound violations of `assignment`, from the instance alone."""
    times, mems, violations, degradation = {}, {}, [], 0.0
    for g in instance.groups:
        choice = assignment[g.name]
        bad = [f"{g.name}: {op} at {choice.get(op)!r}, allowed {allowed}"
               for op, allowed in g.allowed.items() if choice.get(op) not in allowed]
        if bad:  # this group's figures cannot be computed; the other groups' still are
            violations.extend(bad)
            continue
        times[g.name] = t = group_time_ms(g, choice)
        mems[g.name] = m = group_mem_bytes(g, choice)
        degradation += g.share * sum(instance.omega[op][choice[op]] for op in g.allowed)
        if g.time_bound_ms is not None and t > g.time_bound_ms * (1 + rel_tol) + 1e-9:
            violations.append(f"{g.name}: time {t:.4f} ms > bound {g.time_bound_ms:.4f} ms")
        if m > g.mem_capacity_bytes * (1 + rel_tol):
            violations.append(f"{g.name}: memory {m:.0f} B > capacity {g.mem_capacity_bytes:.0f} B")
    if instance.max_degradation is not None and degradation > instance.max_degradation * (1 + rel_tol) + 1e-12:
        violations.append(f"degradation {degradation:.6g} > budget {instance.max_degradation:.6g}")
    return Evaluation(
        time_ms=times,
        mem_bytes=mems,
        degradation=degradation,
        iteration_ms=max(times.values(), default=0.0),
        violations=violations,
    )
