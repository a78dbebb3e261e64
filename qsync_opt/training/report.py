"""Human-readable views of a plan: the table `qsync-opt solve` prints."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qsync_opt.training.plan import Plan
from qsync_opt.precision import PRECISIONS

GiB = 1024**3


PLAN_LEGEND = {
    "batch": "each device's share of the global batch",
    "ops per precision": "how many operators run at each precision (fp32:10 int8:1: 10 operators in fp32, 1 in int8)",
    "compute ms": "predicted compute time of one iteration on the group",
    "comm ms": "predicted gradient communication not hidden behind compute",
    "iter ms": "predicted iteration time of the group",
    "bound ms": "the group's time bound from the spec (-: none)",
    "memory GiB": "predicted peak / capacity of one device",
    "Σω (group)": "the indicator sum of the group's operators (unweighted): the accuracy-degradation estimate, "
                  "lower is closer to full precision",
}
"""The plan table's columns, defined under it (`qsync-opt solve`) and under the run report's plan table."""


def legend_text(columns) -> str:
    """PLAN_LEGEND's lines for `columns`, one `column: meaning.` per line."""
    return "\n".join(f"{c}: {PLAN_LEGEND[c]}." for c in columns if c in PLAN_LEGEND)


def plan_table(plan: Plan) -> Table:
    t = Table(title=f"{plan.job}: {plan.model}  (objective: {plan.objective})", title_justify="left",
              caption=legend_text(PLAN_LEGEND), caption_justify="left")
    for col in ("group", "device", "batch", "ops per precision", "compute ms", "comm ms", "iter ms", "bound ms", "memory GiB", "Σω (group)"):
        t.add_column(col, justify="left" if col in ("group", "device", "ops per precision") else "right")
    for name, g in plan.groups.items():
        counts = g.counts()
        mix = " ".join(f"{p}:{counts[p]}" for p in PRECISIONS if p in counts)
        t.add_row(
            name,
            f"{g.count}x {g.device}",
            str(g.local_batch),
            mix,
            f"{g.compute_ms:.1f}",
            f"{g.comm_exposed_ms:.1f}",
            f"{g.iteration_ms:.1f}",
            "-" if g.time_bound_ms is None else f"{g.time_bound_ms:.1f}",
            f"{g.peak_memory_bytes / GiB:.2f}/{g.memory_capacity_bytes / GiB:.1f}",
            f"{g.indicator:.4g}",
        )
    return t


MEETS_BOUNDS = ("whether the policy meets every time bound and every group's memory capacity (for this plan, by "
               "the replayer's timeline of it)")
"""The "meets bounds" column, defined where it appears (`qsync-opt solve`'s table and the run's report.md)."""


def plan_meets_bounds(plan: Plan) -> bool:
    """Does the plan meet its bounds: the replayer's lockstep verdict (refine.judge) and memory on every group. The
    one source of the "meets bounds" cell of this plan, in the CLI's table and in report.md alike."""
    return plan.meets_bounds and all(g.peak_memory_bytes <= g.memory_capacity_bytes for g in plan.groups.values())


def meets_bounds_cell(plan: Plan) -> str:
    """`plan_meets_bounds` as the table cell."""
    return "yes" if plan_meets_bounds(plan) else "no (see notes)"


def baseline_table(plan: Plan) -> Table:
    t = Table(title="plan vs baselines", title_justify="left",
              caption=f"Σ share·ω: groups' Σω weighted by batch share (minimised)\nmeets bounds: {MEETS_BOUNDS}",
              caption_justify="left")
    for col in ("policy", "iteration ms", "Σ share·ω", "meets bounds"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    t.add_row(Text("this plan", style="bold"), f"{plan.iteration_ms:.1f}", f"{plan.indicator:.4g}", meets_bounds_cell(plan))
    for name, b in plan.baselines.items():
        t.add_row(name, f"{b.iteration_ms:.1f}", f"{b.indicator:.4g}", "yes" if b.feasible else "no")
    return t


def data_plane_table(plan: Plan):
    """The plan's data-plane section: each group's speed and c(L), and the loader workers per source."""
    from rich.console import Group

    dp = plan.data_plane
    L = dp.reference_length
    t = Table()
    for col in ("group", "speed", "c(L) seconds = c0 + a·L + b·L²", f"ms at L={L}"):
        t.add_column(col, justify="left" if col == "group" or col.startswith("c(L)") else "right")
    for name, g in dp.groups.items():
        t.add_row(name, f"{g.speed:.3f}", f"{g.c0:.3g} + {g.a:.3g}·L + {g.b:.3g}·L²",
                  f"{(g.c0 + g.a * L + g.b * L * L) * 1e3:.3f}")
    w = Table()
    for col in ("source", "loader workers", "preprocess ms/sample", "demand samples/s"):
        w.add_column(col, justify="left" if col == "source" else "right")
    for name, n in dp.loader_workers.items():
        w.add_row(name, str(n), f"{dp.preprocess_ms[name]:.4f}", f"{dp.demand_samples_per_s[name]:.1f}")
    return Group(
        Text(f"data plane: balance {dp.balance} (policy {dp.policy}); rank speeds from the plan", style="bold"),
        t, Text(f"speeds from {dp.speeds_from}"),
        Text(f"loader workers within {dp.loader_cpus} CPUs ({dp.sizing_status}; supply/demand of the "
             f"slowest source {dp.supply_ratio:.3g})", style="bold"), w)


INTERNAL_NOTES = ("warm-started from", "cpsat integer scaling", "build ", "highs:", "cbc:", "scip:", "cpsat:",
                  "greedy:")
"""Prefixes of solver notes that are detail for whoever tunes the solver, not for the plan's user:
a backend's own message (tie-break details included), warm starts, scaling, timings."""


def user_notes(notes: list[str]) -> tuple[list[str], list[str]]:
    """(notes for every reader, internal detail shown under --verbose)."""
    internal = [n for n in notes if n.startswith(INTERNAL_NOTES)]
    return [n for n in notes if n not in internal], internal


def print_plan(plan: Plan, console: Console, verbose: bool = False) -> None:
    console.print(plan_table(plan))
    if plan.baselines:
        console.print(baseline_table(plan))
    s = plan.solver
    gap = "" if s.gap is None else f", gap {s.gap:.2%}"
    console.print(
        f"solver: {s.backend} -> {s.status}{gap}, objective {s.objective:.6g}, "
        f"{s.wall_s * 1000:.0f} ms, refine rounds {s.refine_rounds}"
    )
    if plan.data_plane is not None:
        console.print(data_plane_table(plan))
        for note in plan.data_plane.notes:
            console.print(f"  data plane: {note}")
    shown, internal = user_notes(s.notes)
    for note in shown + (internal if verbose else []):
        console.print(f"  note: {note}")
    if internal and not verbose:
        console.print(f"  ({len(internal)} solver detail note(s): --verbose shows them)")
