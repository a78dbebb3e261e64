"""What `qsync-opt run` writes for a rollout spec: the per-worker timeline and KV-utilisation PNGs, report.md,
and the table of a real run here beside its calibrated prediction (`rollout.plan` makes the plan they show)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from qsync_opt.io import atomic_write_bytes, atomic_write_text
from qsync_opt.rollout import ray_run
from qsync_opt.rollout.plan import (
    TIE_FRAC,
    RolloutPlan,
    plan_from,
    recommend_measured,
    simulate_variants,
)
from qsync_opt.rollout.report import POLICY_LEGEND, legend_lines, staleness_cell
from qsync_opt.rollout.simulate import VARIANTS, SimResult, simulate

COLORS = {"generating": "#2b8a3e", "idle": "#dee2e6", "syncing": "#1c7ed6", "migrating": "#e8590c"}


def simulate_with_timelines(job, variants=VARIANTS, steps: int | None = None,
                            timeline_steps: int = 4) -> tuple[dict[str, SimResult], dict[str, float]]:
    """Every variant simulated whole, each keeping its per-worker timeline over its first `timeline_steps` trainer
    steps; returns (variant -> SimResult, variant -> simulated second its first `timeline_steps` steps end).
    A short run per variant finds that second; the whole runs then share the latest (`simulate_variants`)."""
    n = min(timeline_steps, steps or job.rollout.steps)
    until = {v: simulate(job, v, steps=n).sim_time_s for v in variants}
    results = simulate_variants(job, variants, steps=steps, timeline_until=max(until.values(), default=0.0))
    return results, until


def write_report(job, out_dir: str | Path, variants=("sync", "trajectory-async", "repack-program"),
                 steps: int | None = None, timeline_steps: int = 4, max_workers: int = 32) -> dict[str, Path]:
    """Timeline PNG (per worker: generating, idle, syncing, migrating) and KV-utilisation PNG for
    `variants`; returns the paths written."""
    results, until = simulate_with_timelines(job, variants, steps, timeline_steps)
    return draw_report(job, out_dir, results, until, timeline_steps, max_workers)


def pictured(plan: RolloutPlan) -> list[str]:
    """The variants `run_report` draws: sync, the fastest policy without repack but sync, and the recommended one."""
    fig = {p.variant: p for p in plan.policies}
    plain = [v for v in VARIANTS if v in fig and v not in ("sync", "repack-best-fit", "repack-program")]
    shown = ["sync"] if "sync" in fig else []
    if plain:
        shown.append(max(plain, key=lambda v: fig[v].trajectories_per_s))
    if plan.recommended not in shown:
        shown.append(plan.recommended)
    return shown


def run_report(job, out_dir: str | Path, steps: int | None = None, timeline_steps: int = 4,
               max_workers: int = 32, extra_notes: list[str] | None = None) -> tuple[RolloutPlan, dict[str, Path]]:
    """`qsync-opt run` on a rollout spec: every policy simulated (the plan), then out_dir/plan.json, timeline.png
    and kv_utilisation.png (the variants of `pictured`) and report.md, each written whole or not at all.
    `extra_notes`: added to the plan's notes (the batch cap's choice, rollout.admission)."""
    results, until = simulate_with_timelines(job, VARIANTS, steps, timeline_steps)
    plan = plan_from(job, results, steps, extra_notes)
    shown = pictured(plan)
    paths = draw_report(job, out_dir, {v: results[v] for v in shown}, until, timeline_steps, max_workers)
    out = Path(out_dir)
    paths["plan"] = out / "plan.json"
    atomic_write_text(paths["plan"], plan.to_json())
    paths["report"] = out / "report.md"
    atomic_write_text(paths["report"], report_markdown(plan, shown))
    return plan, paths


MEASURED_LEGEND = (
    ("measured traj/s", "trajectories trained per second in this run here (the median round)"),
    ("predicted", "the simulator's traj/s with its costs fitted to this run (calibrated), not the spec's costs"),
    ("off", "predicted / measured - 1: how far the calibrated simulator is from the measurement"),
    ("rollout idle m/p", "share of the rollouts' time not generating, measured / predicted"),
    ("trainer idle m/p", "share of the time the trainer is not training, measured / predicted"),
    ("rank m/c/s", "the policy's rank (1 = fastest) measured, by the calibrated simulator, and by the simulation "
     "under the spec's costs (the plan's table); policies predicted alike share a rank"),
)
"""Every column of the measured table, defined under it in report.md and on the console."""


def write_measured(job, out_dir: str | Path, rounds: int = 1, console=None,
                   plan: RolloutPlan | None = None) -> dict[str, Path]:
    """Run every policy here on Ray actors `rounds` times (`ray_run.measured_vs_predicted`), write
    out_dir/measured.csv (measured beside the simulator calibrated from this run), recommend on that evidence
    (`plan.recommend_measured`), and rewrite out_dir/plan.json and report.md with that recommendation and the measured
    table; print the same on `console` if given. `plan`: the simulated plan `run_report` wrote (default: read from
    out_dir/plan.json). The run's figures are this machine's, not the spec's fleet's."""
    import csv
    import io

    out = Path(out_dir)
    if plan is None:
        plan = RolloutPlan.model_validate_json((out / "plan.json").read_text())
    if plan.simulated_recommended is not None:  # a plan a real run already rewrote: back to the simulation's own
        plan = plan.model_copy(update={"recommended": plan.simulated_recommended, "reason": plan.simulated_reason,
                                       "evidence": "simulated", "simulated_recommended": None,
                                       "simulated_reason": None})
    load0 = os.getloadavg()[0]
    per_round: dict[str, list[float]] = {}
    rows, info = ray_run.measured_vs_predicted(job, rounds, per_round=per_round)
    load1 = os.getloadavg()[0]
    buf = io.StringIO()
    buf.write(f"# {job.name}: every policy on Ray actors here, {rounds} interleaved round(s), median round; load "
              f"{load0:.2f} -> {load1:.2f} on {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    buf.write(f"# calibration: {info}\n")
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    paths = {"measured": out / "measured.csv"}
    atomic_write_text(paths["measured"], buf.getvalue())
    shown = pictured(plan)  # what run_report drew, from the simulated plan
    section = MeasuredSection(rows, per_round, rounds, load0, load1)
    measured_plan = with_measured(plan, section)
    paths["plan"] = out / "plan.json"
    atomic_write_text(paths["plan"], measured_plan.to_json())
    paths["report"] = out / "report.md"
    atomic_write_text(paths["report"], report_markdown(measured_plan, shown, section))
    if console is not None:
        print_measured(measured_plan, section, console)
    return paths


class MeasuredSection:
    """A real run's figures for the report and the console: `measured_vs_predicted`'s rows, every round's
    trajectories/s per policy, the rounds and the machine's load before and after."""

    def __init__(self, rows: list[dict], per_round: dict[str, list[float]], rounds: int, load0: float, load1: float):
        self.rows, self.per_round, self.rounds, self.load0, self.load1 = rows, per_round, rounds, load0, load1

    def recommendation(self, plan: RolloutPlan):
        """`recommend_measured` on these figures, with the simulated plan's for the disagreements."""
        sim_pick = plan.simulated_recommended or plan.recommended
        return recommend_measured({r["policy"]: r["real_trajectories_per_s"] for r in self.rows},
                                  {r["policy"]: r["predicted_trajectories_per_s"] for r in self.rows},
                                  rounds=self.per_round or None,
                                  simulated={p.variant: p.trajectories_per_s for p in plan.policies},
                                  simulated_pick=sim_pick)

    def cells(self, plan: RolloutPlan) -> list[list[str]]:
        ranks = self.recommendation(plan).ranks
        return [_measured_cells(r, ranks[r["policy"]]) for r in self.rows]


def with_measured(plan: RolloutPlan, section: MeasuredSection) -> RolloutPlan:
    """`plan` recommending on the real run's evidence (`recommend_measured`), the simulation's own kept beside."""
    rec = section.recommendation(plan)
    return plan.model_copy(update={
        "recommended": rec.variant, "reason": rec.reason, "evidence": "measured here",
        "simulated_recommended": plan.simulated_recommended or plan.recommended,
        "simulated_reason": plan.simulated_reason or plan.reason})


def print_measured(plan: RolloutPlan, section: MeasuredSection, console) -> None:
    """The measured table, its legend, the recommendation on that evidence and the disagreements: what report.md
    says, on the console."""
    from rich.table import Table

    rec = section.recommendation(plan)
    t = Table(title=f"measured here vs the calibrated simulator ({section.rounds} round(s), load {section.load0:.2f} "
                    f"-> {section.load1:.2f})", title_justify="left",
              caption="\n".join(legend_lines(MEASURED_LEGEND)), caption_justify="left")
    for col in ("policy", "measured traj/s", "predicted", "off", "rollout idle m/p", "trainer idle m/p", "rank m/c/s"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for c in section.cells(plan):
        t.add_row(*c)
    console.print(t)
    console.print(f"rule: {rec.rule}")
    console.print(f"recommended (measured here): {plan.recommended} — {plan.reason}")
    for d in rec.disagreements:
        console.print(f"simulation and measurement disagree: {d}")


def _measured_cells(r: dict, rank: tuple[int, int, int | None]) -> list[str]:
    """One row of `measured_vs_predicted` as the report's and the console's table cells."""
    return [r["policy"], f"{r['real_trajectories_per_s']:.2f}", f"{r['predicted_trajectories_per_s']:.2f}",
            f"{r['predicted_vs_real']:+.0%}",
            f"{r['real_rollout_idle_frac']:.0%} / {r['predicted_rollout_idle_frac']:.0%}",
            f"{r['real_trainer_idle_frac']:.0%} / {r['predicted_trainer_idle_frac']:.0%}",
            "/".join("-" if x is None else str(x) for x in rank)]


def report_markdown(plan: RolloutPlan, shown: list[str], measured: MeasuredSection | None = None) -> str:
    """report.md: the recommendation (on measured figures when `measured` is given), the simulated policies with their
    legend, the workers, the pictures, and the measured table with its legend, rule and disagreements."""
    head = [f"# {plan.name}: rollout plan", "",
            f"{plan.model}, {plan.batch} trajectories per trainer step, {plan.steps} trainer steps simulated.", ""]
    if measured is not None:
        head += [f"**Recommended: {plan.recommended}** (measured here, {measured.rounds} round(s) on Ray actors; "
                 f"\"Measured here\" below): {plan.reason}.", "",
                 f"The simulation alone (the spec's costs, the table below) recommends {plan.simulated_recommended}: "
                 f"{plan.simulated_reason}.", ""]
    else:
        head += [f"**Recommended: {plan.recommended}**: {plan.reason}.", ""]
    lines = head
    if plan.ceiling:
        lines += [f"Ceiling (under these costs): {plan.ceiling.line()}.", ""]
    lines += ["## Policies (simulated, the spec's costs)", "",
              "| policy | traj/s | tokens/s | × sync | of ceiling | rollout idle | trainer idle | staleness mean / max "
              "| KV util | repacks | moves |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    sync = next((p.trajectories_per_s for p in plan.policies if p.variant == "sync"), None)
    sim_pick = plan.simulated_recommended or plan.recommended
    for p in plan.policies:
        x = f"{p.trajectories_per_s / sync:.2f}" if sync else ""
        mark = " (recommended)" if p.variant == plan.recommended else ""
        if measured is not None and p.variant == sim_pick:
            mark += " (the simulation's pick)"
        share = f"{p.trajectories_per_s / p.ceiling_tps:.0%}" if p.ceiling_tps else ""
        lines.append(f"| {p.variant}{mark} | {p.trajectories_per_s:.2f} | {p.tokens_per_s:,.0f} | {x} | {share} | "
                     f"{p.rollout_idle_frac:.1%} | {p.trainer_idle_frac:.1%} | {staleness_cell(p)} | "
                     f"{p.kv_util_mean:.1%} | {p.repacks} | {p.moves} |")
    lines += ["", *(f"- {x}" for x in legend_lines(POLICY_LEGEND)[:-1]), ""]  # no solver ms column here
    rec = next((p for p in plan.policies if p.variant == plan.recommended), None)
    if rec is not None and (room := rec.room_line()):
        lines += [room[0].upper() + room[1:] + ".", ""]
    lines += ["| group | device | bits | count | KV tokens | decode ms at the batch cap | prefill ms | pull s |",
              "|---|---|---|---|---|---|---|---|"]
    for w in plan.workers:
        lines.append(f"| {w.group} | {w.device} | {w.bits} | {w.count} | {w.kv_capacity_tokens:,.0f} | "
                     f"{w.decode_ms_at_cap:.1f} | {w.prefill_ms:.1f} | {w.pull_s:.2f} |")
    lines += ["", f"Weight sync: global broadcast {plan.broadcast_s:.2f} s (every rollout stalls), relay push "
              f"{plan.push_s:.2f} s (the trainer only). {plan.trainer_line()[0].upper()}{plan.trainer_line()[1:]}.", "",
              f"Per-worker timeline ({', '.join(shown)}): ![timeline](timeline.png)", "",
              "KV-cache utilisation over all rollouts: ![KV utilisation](kv_utilisation.png)", ""]
    lines += [f"Note: {n}." for n in plan.notes]
    if measured is not None:
        rec = measured.recommendation(plan)
        lines += ["", f"## Measured here ({measured.rounds} round(s) on Ray actors, load {measured.load0:.2f} -> "
                  f"{measured.load1:.2f})", "",
                  "Every policy run on this machine, beside the simulator calibrated from that run (measured.csv).", "",
                  "| policy | measured traj/s | predicted | off | rollout idle m/p | trainer idle m/p | rank m/c/s |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {' | '.join(c)} |" for c in measured.cells(plan)]
        lines += ["", *(f"- {x}" for x in legend_lines(MEASURED_LEGEND)), "",
                  f"Rule: {rec.rule}; the fastest measured policy is recommended, and among policies the measurement "
                  f"does not separate from it, the calibrated simulator's fastest (within {TIE_FRAC:.0%}, the "
                  "simplest).", ""]
        if rec.disagreements:
            lines += ["Where simulation and measurement disagree:", "", *(f"- {d}" for d in rec.disagreements)]
        else:
            lines += ["Simulation and measurement agree on every pair the measurement separates."]
    return "\n".join(lines) + "\n"


def draw_report(job, out_dir: str | Path, results: dict[str, SimResult], until: dict[str, float],
                timeline_steps: int = 4, max_workers: int = 32) -> dict[str, Path]:
    """Draw timeline.png (each variant's first `timeline_steps` trainer steps, up to `until[variant]`) and
    kv_utilisation.png for `results` (SimResults with timelines) into out_dir; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    variants = list(results)
    fig, axes = plt.subplots(len(variants), 1, figsize=(12, 2.2 + 0.12 * min(max_workers, len(results[variants[0]].timeline)) * len(variants)),
                             squeeze=False)
    for ax, v in zip(axes[:, 0], variants):
        res = results[v]
        end = until.get(v) or max((b for segs in res.timeline for _, b, _ in segs), default=1.0)
        lanes = res.timeline[:max_workers]
        for i, segs in enumerate(lanes):
            by = {}
            for a, b, s in segs:
                if a < end:
                    by.setdefault(s, []).append((a, min(b, end) - a))
            for s, spans in by.items():
                ax.broken_barh(spans, (i - 0.4, 0.8), facecolors=COLORS[s], linewidth=0)
        ax.set_xlim(0, end)
        ax.set_ylim(-0.6, len(lanes) - 0.4)
        ax.set_yticks([])
        ax.set_ylabel(f"{len(lanes)} of {len(res.timeline)}\nrollouts", fontsize=8)
        ax.set_title(f"{v}: first {timeline_steps} trainer steps of {res.steps}; {res.trajectories_per_s:.2f} traj/s, "
                     f"rollout idle {res.rollout_idle_frac:.0%}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("simulated seconds")
    fig.legend(handles=[Patch(color=c, label=s) for s, c in COLORS.items()], loc="upper right", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    paths = {"timeline": out / "timeline.png"}
    atomic_write_bytes(paths["timeline"], _png(fig))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for v in variants:
        xs = [t for t, _ in results[v].kv_series]
        ys = [u * 100 for _, u in results[v].kv_series]
        m = 100 * results[v].kv_util_mean
        ax.plot(xs, ys, label=f"{v} (mean {m:.0f}%)" if m >= 1 else f"{v} (mean {m:.2g}%)", linewidth=1)
    ax.set_xlabel("simulated seconds")
    ax.set_ylabel("KV cache in use, % of capacity")
    ax.set_title(f"{job.name}: KV utilisation over all rollouts", fontsize=10, loc="left")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths["kv"] = out / "kv_utilisation.png"
    atomic_write_bytes(paths["kv"], _png(fig))
    plt.close(fig)
    return paths


def _png(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()
