"""Human-readable views of a plan: the table `qsync-opt solve` prints."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from qsync_opt.plan import Plan
from qsync_opt.precision import PRECISIONS

GiB = 1024**3


def plan_table(plan: Plan) -> Table:
    t = Table(title=f"{plan.job}: {plan.model}  (objective: {plan.objective})", title_justify="left")
    for col in ("group", "device", "batch", "ops per precision", "compute ms", "comm ms", "iter ms", "bound ms", "memory GiB", "indicator"):
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


def baseline_table(plan: Plan) -> Table:
    t = Table(title="plan vs baselines", title_justify="left")
    for col in ("policy", "iteration ms", "indicator", "meets bounds"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    meets = all(
        (g.time_bound_ms is None or g.iteration_ms <= g.time_bound_ms * (1 + 1e-6))
        and g.peak_memory_bytes <= g.memory_capacity_bytes
        for g in plan.groups.values()
    )
    t.add_row("[bold]this plan[/bold]", f"{plan.iteration_ms:.1f}", f"{plan.indicator:.4g}", "yes" if meets else "no (see notes)")
    for name, b in plan.baselines.items():
        t.add_row(name, f"{b.iteration_ms:.1f}", f"{b.indicator:.4g}", "yes" if b.feasible else "no")
    return t


def print_plan(plan: Plan, console: Console) -> None:
    console.print(plan_table(plan))
    if plan.baselines:
        console.print(baseline_table(plan))
    s = plan.solver
    gap = "" if s.gap is None else f", gap {s.gap:.2%}"
    console.print(
        f"solver: {s.backend} -> {s.status}{gap}, objective {s.objective:.6g}, "
        f"{s.wall_s * 1000:.0f} ms, refine rounds {s.refine_rounds}"
    )
    for note in s.notes:
        console.print(f"  note: {note}")
