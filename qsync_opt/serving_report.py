"""What `qsync-opt solve` prints for a serving plan: the stage table and the plan beside the baselines."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from qsync_opt.serving_plan import ServingPlan


def _bits(counts: dict[int, int]) -> str:
    return " ".join(f"{b}b×{n}" for b, n in counts.items())


def stage_table(plan: ServingPlan) -> Table:
    w = plan.workload
    t = Table(
        title=(f"{plan.name}: {plan.model}, batch {w['global_batch']}, prompt {w['prompt_len']}, {w['gen_tokens']} new tokens; "
               f"micro-batches prefill {plan.prefill_micro_batch}, decode {plan.decode_micro_batch}"),
        title_justify="left",
    )
    for col in ("stage", "device", "layers", "bits", "prefill ms/mb", "decode ms/mb", "memory GB"):
        t.add_column(col, justify="left" if col in ("device", "bits") else "right")
    for st in plan.stages:
        t.add_row(str(st.position), f"{st.device} {st.device_type}", f"{st.layers[0]}–{st.layers[1] - 1}", _bits(st.bit_counts),
                  f"{st.prefill_ms:.1f}", f"{st.decode_ms:.2f}", f"{st.memory_gb:.2f}/{st.capacity_gb:.2f}")
    return t


def comparison_table(plan: ServingPlan) -> Table:
    t = Table(title="plan vs baselines (same cost model)", title_justify="left")
    for col in ("policy", "tokens/s", "× best baseline", "e2e s", "prefill s", "decode s", "Σω", "micro-batches", "partition (layers per stage)", "search s"):
        t.add_column(col, justify="left" if col in ("policy", "partition (layers per stage)") else "right")
    best = plan.best_baseline()
    ref = best.prediction.tokens_per_s if best else None
    rows = [("plan", plan.prediction, plan.stages, plan.prefill_micro_batch, plan.decode_micro_batch, plan.solver.wall_s, "")]
    rows += [(b.name, b.prediction, b.stages, b.prefill_micro_batch, b.decode_micro_batch, b.solve_s, b.note) for b in plan.baselines]
    for name, p, stages, bp, bd, wall, _ in rows:
        if p is None:
            t.add_row(name, "does not fit", "", "", "", "", "", "", "", f"{wall:.2f}")
            continue
        part = " ".join(f"{s.layers[1] - s.layers[0]}@{'/'.join(str(b) for b in s.bit_counts)}" for s in stages)
        t.add_row(name, f"{p.tokens_per_s:.1f}", f"{p.tokens_per_s / ref:.2f}" if ref else "-", f"{p.e2e_ms / 1e3:.2f}",
                  f"{p.prefill_ms / 1e3:.2f}", f"{p.decode_ms / 1e3:.2f}", f"{p.quality:.4g}", f"{bp}/{bd}", part, f"{wall:.2f}")
    return t


def print_serving_plan(plan: ServingPlan, console: Console) -> None:
    console.print(stage_table(plan))
    console.print(comparison_table(plan))
    s = plan.solver
    gap = "-" if s.gap is None else f"{s.gap:.2e}"
    console.print(
        f"solver: {s.backend} {s.status} (gap {gap}, asked {s.rel_gap:g}), {s.programs} programs solved, {s.pruned} pruned by bound, "
        f"{s.form} form ({s.variables} variables, {s.constraints} rows), {s.wall_s:.2f} s",
        highlight=False,
    )
    bound = "none" if plan.quality_bound is None else f"Σω ≤ {plan.quality_bound:.6g}"
    console.print(f"quality: Σω = {plan.prediction.quality:.6g}, bound {bound}; {plan.quality_source}", highlight=False)
    console.print(f"costs: {plan.cost_source}", highlight=False)
    for n in plan.notes:
        console.print(f"note: {n}", highlight=False)
