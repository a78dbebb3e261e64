"""What `qsync-opt solve` prints for a rollout plan: the workers' costs, every policy side by side, the legend."""

from __future__ import annotations

from rich.table import Table

from qsync_opt.rollout.plan import PolicyFigures, RolloutPlan


POLICY_LEGEND = (
    ("traj/s", "trajectories trained per simulated second; tokens/s: response tokens trained per second"),
    ("× sync", "traj/s over sync's"),
    ("of ceiling", "traj/s over the proven ceiling of the trajectories that run trained, under the staleness rule "
     "(rollout.bounds_staleness)"),
    ("rollout idle", "share of the rollouts' time not generating (idle, receiving weights, migrating)"),
    ("trainer idle", "share of the time the trainer is not training"),
    ("staleness mean / max", "per trained trajectory, the trainer's version when it trains on it minus the version "
     "of the weights its first token was generated with. The spec's eta bounds admission, not this: at most "
     "(eta + version + 1) x batch trajectories admitted (AReaL's rule; trajectory-async: a rollout admits only while "
     "its weights are fewer than eta versions behind), so a long response admitted within the rule is overtaken by "
     "shorter ones and trained several versions later, and the max can exceed eta; \"N% > eta\": the share of "
     "trained trajectories staler than eta (streaming policies)"),
    ("KV util", "KV cache in use over its capacity, mean over time and rollouts"),
    ("repacks", "repack decisions made (trajectory-async with repack); moves: trajectories they moved"),
    ("solver ms", "wall time of one repack decision here, mean / max"),
)
"""Every column of the policies' table, defined under it in report.md and on the console."""


def staleness_cell(p: PolicyFigures, sep: str = " / ") -> str:
    """The staleness cell: mean / max, and the share staler than eta for a streaming policy."""
    over = "" if p.stale_over_eta_frac is None else f", {p.stale_over_eta_frac:.0%} > eta"
    return f"{p.staleness_mean:.2f}{sep}{p.staleness_max}{over}"


def legend_lines(legend) -> list[str]:
    """A legend as lines `column: meaning.`"""
    return [f"{name}: {text}." for name, text in legend]


def print_plan(plan: RolloutPlan, console, real_pending: bool = False) -> None:
    """The plan as two rich tables: the workers' costs, and every policy side by side, the legend under it.
    `real_pending`: a real run follows and decides the recommendation, so the simulation's is printed as its own."""
    t = Table(title=f"{plan.name}: {plan.model}, {plan.batch} trajectories per trainer step, {plan.steps} steps",
              title_justify="left")
    for col in ("group", "device", "bits", "count", "KV tokens", "decode ms @cap", "prefill ms", "pull s"):
        t.add_column(col, justify="left" if col in ("group", "device") else "right")
    for w in plan.workers:
        t.add_row(w.group, w.device, str(w.bits), str(w.count), f"{w.kv_capacity_tokens:,.0f}",
                  f"{w.decode_ms_at_cap:.1f}", f"{w.prefill_ms:.1f}", f"{w.pull_s:.2f}")
    console.print(t)
    console.print(f"weight sync: global broadcast {plan.broadcast_s:.2f} s (all stall), relay push {plan.push_s:.2f} s "
                  "(trainer only)")
    console.print(plan.trainer_line())
    if plan.ceiling:
        console.print(f"ceiling: {plan.ceiling.line()}")
    p = Table(title="policies (simulated, same costs)", title_justify="left",
              caption="\n".join(legend_lines(POLICY_LEGEND)), caption_justify="left")
    for col in ("policy", "traj/s", "tokens/s", "× sync", "of ceiling", "rollout idle", "trainer idle",
                "staleness mean / max", "KV util", "repacks", "moves", "solver ms (mean/max)"):
        p.add_column(col, justify="left" if col == "policy" else "right")
    sync = next((x for x in plan.policies if x.variant == "sync"), None)
    for x in plan.policies:
        mark = " ◀" if x.variant == plan.recommended else ""
        p.add_row(x.variant + mark, f"{x.trajectories_per_s:.2f}", f"{x.tokens_per_s:,.0f}",
                  f"{x.trajectories_per_s / sync.trajectories_per_s:.2f}" if sync else "",
                  f"{x.trajectories_per_s / x.ceiling_tps:.0%}" if x.ceiling_tps else "",
                  f"{x.rollout_idle_frac:.1%}", f"{x.trainer_idle_frac:.1%}",
                  staleness_cell(x, "/"), f"{x.kv_util_mean:.1%}", str(x.repacks), str(x.moves),
                  f"{x.solver_wall_ms_mean:.1f}/{x.solver_wall_ms_max:.1f}" if x.repacks else "")
    console.print(p)
    if real_pending:
        console.print(f"the simulation recommends: {plan.recommended} — {plan.reason} (the real run below decides)")
    else:
        console.print(f"recommended: {plan.recommended} — {plan.reason}")
    rec = next((x for x in plan.policies if x.variant == plan.recommended), None)
    if rec is not None and (line := rec.room_line()):
        console.print(line)
    for n in plan.notes:
        console.print(f"note: {n}")
