"""What `qsync-opt solve` prints for a loading plan: a row per rank (its mean share of a global batch) and the
summary: the predicted step time against the lower bound and against an even split by count."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from qsync_opt.loading.plan import LoadingPlan

RANK_LEGEND = (
    ("speed", "relative speed the balancer used (a rank with its own cost curve: the fastest rank's seconds for a "
     "sample of the mean length over this rank's)"),
    ("c(L) ms", "the rank's predicted time for one sample of L tokens: c0 + a·L + b·L²"),
    ("samples, tokens", "mean per planned step"),
    ("predicted ms", "mean of Σ c(L) over the rank's samples, per step"),
    ("busy", "predicted ms over the mean step time (the slowest rank's): the rest is waiting at the step's end"),
    ("even ms", "the same, were each global batch split evenly by count (sample i to rank i mod K)"),
)
"""The rank table's columns, printed under it."""


def _curve(c0: float, a: float, b: float) -> str:
    terms = [f"{c0 * 1e3:.3g}"] if c0 else []
    terms += [f"{a * 1e3:.3g}·L"] if a else []
    terms += [f"{b * 1e3:.3g}·L²"] if b else []
    return " + ".join(terms) or "0"


def rank_table(plan: LoadingPlan) -> Table:
    s = plan.summary
    t = Table(title=(f"{plan.name}: {len(plan.ranks)} ranks, global batch {plan.global_batch}, sources "
                     f"{', '.join(plan.sources)}; balancer {plan.policy} ({plan.backend or 'heuristics only'}), "
                     f"{s.steps} steps planned"),
              title_justify="left", caption="\n".join(f"{k}: {v}." for k, v in RANK_LEGEND), caption_justify="left")
    for col in ("rank", "device", "speed", "c(L) ms", "samples", "tokens", "predicted ms", "busy", "even ms"):
        t.add_column(col, justify="left" if col in ("rank", "device", "c(L) ms") else "right")
    n = max(len(plan.split), 1)
    for r, (info, mean) in enumerate(zip(plan.ranks, plan.rank_means())):
        even = sum(st.even_ranks_s[r] for st in plan.split) / n
        busy = mean.predicted_s / s.step_s if s.step_s > 0 else 0.0
        t.add_row(info.name, info.device or "-", f"{info.speed:.3g}", _curve(info.c0, info.a, info.b),
                  str(mean.samples), str(mean.tokens), f"{mean.predicted_s * 1e3:.2f}", f"{busy:.0%}",
                  f"{even * 1e3:.2f}")
    return t


def summary_lines(plan: LoadingPlan) -> list[str]:
    s = plan.summary
    lines = [
        f"predicted step time {s.step_s * 1e3:.2f} ms (mean over {s.steps} steps); lower bound "
        f"{s.bound_s * 1e3:.2f} ms, gap {s.gap:.1%}",
        f"even split by count: {s.even_s * 1e3:.2f} ms per step; the balanced split is {s.speedup:.2f}x faster",
        f"balancer: {s.optimal_steps} of {s.steps} steps proven optimal"
        + (f", {s.time_limited_steps} stopped at the time limit" if s.time_limited_steps else ""),
    ]
    if plan.max_step_s is not None:
        worst = max(st.makespan_s for st in plan.split)
        met = "met" if plan.meets_bounds else "MISSED"
        lines.append(f"bound max_step_ms {plan.max_step_s * 1e3:g}: {met} (slowest step {worst * 1e3:.2f} ms)")
    return lines


def print_loading_plan(plan: LoadingPlan, console: Console) -> None:
    console.print(rank_table(plan))
    for line in summary_lines(plan):
        console.print(line)
