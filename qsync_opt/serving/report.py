"""What `qsync-opt solve` prints for a serving plan: the stage table and the plan beside the baselines."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from qsync_opt.serving.baselines import BASELINE_DOC
from qsync_opt.serving.plan import ServingPlan


STAGE_LEGEND = (
    ("layers", "the decoder layers the stage holds, first–last"),
    ("bits", "bit-width x the number of its layers at it (8b×3: three layers at 8 bits)"),
    ("prefill / decode ms/mb", "predicted time of one micro-batch through the stage"),
    ("memory GB", "predicted peak memory / the device's capacity"),
    ("costs", "where the stage's times come from: measured on this machine (`qsync-opt profile`) or the roofline"),
)
"""The stage table's notation, printed under it."""

COMPARISON_LEGEND = (
    ("× best baseline", "tokens/s over the fastest baseline's"),
    ("e2e s", "the batch's end-to-end time, prefill + decode"),
    ("Σω", "LLM-PQ's quality indicator summed over the layers (lower: closer to the 16-bit model)"),
    ("micro-batches", "prefill / decode micro-batch size"),
    ("partition", "one entry per stage in pipeline order, layers@bits: 21@8/4 is 21 layers at 8 and 4 bits "
     "(how many at each: the stage table), 9@4 is 9 layers at 4 bits"),
    ("search s", "wall time spent finding the policy"),
)
"""The comparison table's columns and notation, printed under it."""


def _bits(counts: dict[int, int]) -> str:
    return " ".join(f"{b}b×{n}" for b, n in counts.items())


def stage_table(plan: ServingPlan) -> Table:
    w = plan.workload
    t = Table(
        title=(f"{plan.name}: {plan.model}, batch {w['global_batch']}, prompt {w['prompt_len']}, {w['gen_tokens']} new tokens; "
               f"micro-batches prefill {plan.prefill_micro_batch}, decode {plan.decode_micro_batch}"),
        title_justify="left", caption="\n".join(f"{k}: {v}." for k, v in STAGE_LEGEND), caption_justify="left",
    )
    for col in ("stage", "device", "layers", "bits", "prefill ms/mb", "decode ms/mb", "memory GB", "costs"):
        t.add_column(col, justify="left" if col in ("device", "bits", "costs") else "right")
    for st in plan.stages:
        t.add_row(str(st.position), f"{st.device} {st.device_type}", f"{st.layers[0]}–{st.layers[1] - 1}", _bits(st.bit_counts),
                  f"{st.prefill_ms:.1f}", f"{st.decode_ms:.2f}", f"{st.memory_gb:.2f}/{st.capacity_gb:.2f}",
                  st.cost_source)
    return t


def comparison_legend(plan: ServingPlan) -> list[str]:
    """The lines under the comparison table: each policy (with its paper) and each column's notation."""
    names = ["plan"] + [b.name for b in plan.baselines]
    return [f"{n}: {BASELINE_DOC[n]}." for n in names if n in BASELINE_DOC] + [
        f"{k}: {v}." for k, v in COMPARISON_LEGEND]


def comparison_table(plan: ServingPlan) -> Table:
    t = Table(title="plan vs baselines (same cost model)", title_justify="left",
              caption="\n".join(comparison_legend(plan)), caption_justify="left")
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
