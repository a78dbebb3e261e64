"""`run` for a loading job: plan, then serve the global batches to the ranks as a trainer outside this package
consumes them, then report.

The data plane (`loading.engine.open_engine`: in process, or on Ray with `engine: ray`) hands out each step's
split; one consumer thread per rank takes its sample ids and reads the samples through the engine, as a rank's
input pipeline would. Every artefact is written whole or not at all (`qsync_opt.io.atomic_write_text`):
plan.json after the plan, served.csv and report.md once every step is served; a stop or an error on the way
leaves what was finished before it.
"""

from __future__ import annotations

import csv
import io
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console

from qsync_opt.errors import QSyncError, SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.loading.engine import open_engine
from qsync_opt.loading.plan import LoadingPlan
from qsync_opt.loading.planner import next_batch, opening_sources, plan_loading
from qsync_opt.loading.report import print_loading_plan
from qsync_opt.loading.spec import LoadingJob
from qsync_opt.solver.budget import Budget

SERVED_COLUMNS = ("step", "rank", "name", "samples", "tokens", "predicted_s", "read_s", "plan_s", "wait_s",
                  "takeovers", "ids")
"""served.csv: one row per step and rank; ids are the rank's samples as S:I (sample I of source S, S its position
in the spec's sources from 0), space-separated, in the order the rank read them. plan_s and wait_s are the step's
(the same on each of its rows): the planning's seconds, and what of them the coordinator waited for, the critical
path (less than plan_s with `balancer.prefetch`); takeovers: the step's standby takeovers as source:reason:seconds."""
QUEUE_DEPTH = 2
"""Steps a rank's consumer may be behind the coordinator (a trainer's prefetch depth)."""


@dataclass(frozen=True)
class Served:
    """What one rank read in one step."""

    step: int
    rank: int
    ids: tuple[tuple[int, int], ...]
    tokens: int
    predicted_s: float
    read_s: float
    plan_s: float = 0.0
    wait_s: float = 0.0
    takeovers: tuple[str, ...] = ()


def serve(job: LoadingJob, plan: LoadingPlan, steps: int) -> list[Served]:
    """`steps` global batches from the job's engine, each rank's share read by that rank's consumer thread; the
    rows in (step, rank) order. SpecError naming the source's lengths when a rank reads a sample of another length
    than the index the plane split by."""
    try:
        engine = open_engine(job.mix(), global_batch=job.global_batch, speeds=[r.speed for r in plan.ranks],
                             cost=job.plane_cost(), backend=job.balancer.backend)
    except QSyncError:  # names its field already
        raise
    except (ValueError, TypeError, MemoryError) as e:
        raise opening_sources(e) from None
    rows: list[Served] = []
    failed: list[BaseException] = []
    lock = threading.Lock()
    inboxes = [queue.Queue(maxsize=QUEUE_DEPTH) for _ in job.ranks]

    def consume(r: int) -> None:
        while (item := inboxes[r].get()) is not None:
            if failed:
                continue  # drain: the coordinator stops at the next step
            step, ids, lengths, predicted, plan_s, wait_s = item
            try:
                t0 = time.perf_counter()
                samples = engine.read(ids, step)
                read_s = time.perf_counter() - t0
                got = [len(x) for x in samples]
                if got != lengths:
                    i = next(j for j, (a, b) in enumerate(zip(got, lengths)) if a != b)
                    s, idx = ids[i]
                    raise SpecError(f"sources.{s}.lengths: sample {idx} of source {job.sources[s].name!r} holds "
                                    f"{got[i]} tokens, its lengths say {lengths[i]} (rank {job.ranks[r].name!r} read "
                                    f"it at step {step}); give the lengths of the samples the source returns")
                with lock:
                    rows.append(Served(step, r, tuple(ids), sum(got), predicted, read_s, plan_s, wait_s))
            except BaseException as e:  # noqa: BLE001  (re-raised by the coordinator)
                failed.append(e)

    threads = [threading.Thread(target=consume, args=(r,), name=f"rank-{r}", daemon=True)
               for r in range(len(job.ranks))]
    for t in threads:
        t.start()
    try:
        for step in range(steps):
            if failed:
                break
            sp = next_batch(engine, step)
            for r, inbox in enumerate(inboxes):
                slots = sp.rank_slots(r)
                inbox.put((sp.step, [sp.samples[i] for i in slots], [sp.lengths[i] for i in slots], sp.predicted[r],
                           sp.plan_s, sp.wait_s))
    finally:
        for inbox in inboxes:
            inbox.put(None)
        for t in threads:
            t.join()
        engine.close()
    if failed:
        raise failed[0]
    takeovers = getattr(engine, "takeovers", [])
    by_step = {t.step: tuple(x.cell() for x in takeovers if x.step == t.step) for t in takeovers}
    rows = [replace(x, takeovers=by_step.get(x.step, ())) for x in rows]
    return sorted(rows, key=lambda x: (x.step, x.rank))


def served_csv(job: LoadingJob, rows: list[Served]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SERVED_COLUMNS)
    for x in rows:
        w.writerow([x.step, x.rank, job.ranks[x.rank].name, len(x.ids), x.tokens, f"{x.predicted_s:.6g}",
                    f"{x.read_s:.6g}", f"{x.plan_s:.6g}", f"{x.wait_s:.6g}", " ".join(x.takeovers),
                    " ".join(f"{s}:{i}" for s, i in x.ids)])
    return buf.getvalue()


def matching_steps(plan: LoadingPlan, rows: list[Served]) -> tuple[int, int]:
    """(planned steps whose served split gave every rank the planned samples and tokens, planned steps served)."""
    by_step: dict[int, dict[int, Served]] = {}
    for x in rows:
        by_step.setdefault(x.step, {})[x.rank] = x
    served = [s for s in plan.split if s.step in by_step]
    same = sum(all(by_step[s.step][r].tokens == rs.tokens and len(by_step[s.step][r].ids) == rs.samples
                   for r, rs in enumerate(s.ranks)) for s in served)
    return same, len(served)


def report_md(job: LoadingJob, plan: LoadingPlan, rows: list[Served], steps: int) -> str:
    buf = io.StringIO()
    print_loading_plan(plan, Console(file=buf, width=140, color_system=None, highlight=False, markup=False))
    same, planned = matching_steps(plan, rows)
    lines = [f"# {job.name}: loading plan and {steps} served steps", "", "```", buf.getvalue().rstrip(), "```", "",
             "## served", "", "| rank | samples | tokens | predicted s | read s |", "|---|---:|---:|---:|---:|"]
    for r, rank in enumerate(job.ranks):
        mine = [x for x in rows if x.rank == r]
        lines.append(f"| {rank.name} | {sum(len(x.ids) for x in mine)} | {sum(x.tokens for x in mine)} | "
                     f"{sum(x.predicted_s for x in mine):.4g} | {sum(x.read_s for x in mine):.3g} |")
    per_step = {x.step: x for x in rows}
    if per_step:
        plan_ms = [1e3 * x.plan_s for x in per_step.values()]
        wait_ms = [1e3 * x.wait_s for x in per_step.values()]
        how = "prefetched while the previous step runs" if job.balancer.prefetch else "inline"
        lines += ["", (f"planning per step ({how}): plan_s mean {sum(plan_ms) / len(plan_ms):.3g} ms (max "
                       f"{max(plan_ms):.3g}), on the critical path (wait_s) mean {sum(wait_ms) / len(wait_ms):.3g} ms "
                       f"(max {max(wait_ms):.3g}); per step in served.csv.")]
    taken = [(t, c) for t, x in sorted(per_step.items()) for c in x.takeovers]
    if taken:
        lines += ["", "## standby takeovers", "", "| step | source | why | seconds |", "|---:|---|---|---:|"]
        lines += [f"| {t} | {' | '.join(c.rsplit(':', 2))} |" for t, c in taken]
    elif job.shadow:
        lines += ["", "Standby loaders were armed (shadow: true); none had to take over."]
    sources = ", ".join(f"{i} {s.name}" for i, s in enumerate(job.sources))
    lines += ["", f"served.csv: a row per step and rank; ids S:I is sample I of source S ({sources}).", "",
              f"The served split equals the plan's in {same} of the {planned} planned steps served (a split the "
              "time limit stopped may differ).", ""]
    return "\n".join(lines)


def run_loading(job: LoadingJob, out: Path, steps: int | None = None, console=None,
                budget_for: Callable[[LoadingJob], Budget] | None = None) -> dict[str, str]:
    """plan -> serve -> report into `out`: plan.json, served.csv, report.md; returns artefact -> path. `steps`
    replaces the job's; `budget_for(job)` is the plan's solver budget (None: each step its own time limit)."""
    if steps is not None and steps < 1:
        raise SpecError(f"--steps {steps}: serve at least 1 global batch")
    if steps is not None:
        job = job.model_copy(update={"steps": steps})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    made = plan_loading(job, budget_for(job) if budget_for is not None else None)
    paths = {"plan": str(made.save(out / "plan.json"))}
    if console is not None:
        print_loading_plan(made, console)
        console.print(f"serving {job.steps} global batches of {job.global_batch} to {len(job.ranks)} ranks ...")
    rows = serve(job, made, job.steps)
    paths["served"] = str(atomic_write_text(out / "served.csv", served_csv(job, rows)))
    paths["report"] = str(atomic_write_text(out / "report.md", report_md(job, made, rows, job.steps)))
    if console is not None:
        same, planned = matching_steps(made, rows)
        console.print(f"served {len(rows) // len(job.ranks)} steps; the split equals the plan's in {same} of "
                      f"{planned} planned steps")
    return paths
