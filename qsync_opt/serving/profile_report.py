"""`qsync-opt profile SERVING_SPEC`'s printout: each present group's measured table beside the roofline the planner
would use otherwise, and the fitted fixed cost of a stage call (the measuring and the cache are serving/profile.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from qsync_opt.llm import costs as C
from qsync_opt.serving.profile import (POSITIONS, decode_context, default_path, entry_key, group_costs, load, present,
                                       profile_job, sizes, table_key, wanted)
from qsync_opt.serving.instance import workload
from qsync_opt.serving.spec import ServingJob


def rows(job: ServingJob, group, entries: Mapping[str, float]) -> list[tuple]:
    """(bits, m, measured prefill, roofline prefill, measured decode, roofline decode) per layer, ms, for a
    group's table, beside the roofline the planner would use otherwise; the head as bits 'head'."""
    s, dev, w, ctx = job.serving, group.device_spec, workload(job.serving), decode_context(job)
    out = []
    for m in sizes(job):
        for b in s.bits:
            out.append((b, m, entries.get(entry_key("layer", "prefill", m, s.prompt_len, b)),
                        C.prefill_layer_ms(s.model, w, dev, b, m),
                        entries.get(entry_key("layer", "decode", m, ctx, b)), C.decode_layer_ms(s.model, w, dev, b, m)))
        out.append(("head", m, entries.get(entry_key("head", "prefill", m, s.prompt_len)),
                    C.head_ms(s.model, w, dev, m, "prefill"), entries.get(entry_key("head", "decode", m, ctx)),
                    C.head_ms(s.model, w, dev, m, "decode")))
    return out


def cli_profile(job: ServingJob, output: "str | None", groups: list[str] | None, console,
                progress: bool = True) -> None:
    """`qsync-opt profile SERVING_SPEC [-o FILE] [--groups a,b]`: measure what the cache lacks, then print each
    present group's table beside the roofline (`progress`: unused; each group's measurement logs one line)."""
    from rich.table import Table  # import cost: rich's table, only for this verb

    path = Path(output) if output else default_path()
    profile_job(job, path=path, groups=groups, log=lambda m: console.print(m, highlight=False))
    prof = load(path)
    for g in job.cluster.groups:
        if (groups is not None and g.name not in groups) or not present(g.device_spec):
            continue
        t = Table(title=f"{g.name} ({g.device_spec.name}, env {g.env or '{}'}): one layer, ms per micro-batch",
                  title_justify="left")
        for col in ("bits", "micro-batch", "prefill measured", "prefill roofline", "decode measured", "decode roofline"):
            t.add_column(col, justify="right")
        for r in rows(job, g, prof.entries(table_key(job, g))):
            t.add_row(str(r[0]), str(r[1]), *(("-" if v is None else f"{v:.4g}") for v in r[2:]))
        console.print(t)
        entries = prof.entries(table_key(job, g))
        if all(k in entries for k in wanted(job)):
            fit = group_costs(job, entries).fixed
            for ph in ("prefill", "decode"):
                console.print(f"{g.name} {ph}: a stage call's fixed ms (fit), per micro-batch size: " + "; ".join(
                    f"m={m}: " + " ".join(f"{p} {fit[(p, ph, m)]:.3g}" for p in POSITIONS) for m in sizes(job)),
                    highlight=False)
    s = job.serving
    console.print(f"prefill: {s.prompt_len} tokens per prompt; decode: one token at context {decode_context(job)}; "
                  f"head: embedding + LM head per micro-batch; profile {path}", highlight=False)
