"""The rollout plan: every policy simulated under the same costs, one recommended, and its report.

`solve(job)` simulates each variant (sync, one-step-off, stale, partial-rollout, trajectory-async,
and trajectory-async with best-fit and program repack) and recommends one (`recommend`): the simplest
variant, in that order, within TIE_FRAC of the highest trajectories/s. The figures are predictions of
the simulator under the serving cost model (or calibrated costs), not measurements.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from qsync_opt.rollout.bounds import ceiling
from qsync_opt.rollout.costs import all_worker_costs, sync_costs
from qsync_opt.rollout.simulate import VARIANTS, SimResult, simulate

PLAN_VERSION = 1

log = logging.getLogger(__name__)
"""Progress of `simulate_variants` at INFO, one line per policy simulated: `qsync-opt solve` and `run` print it on
stderr; a library caller sees it only if it configures logging."""

TIE_FRAC = 0.01
"""Variants within this fraction of the fastest count as tied with it. The simulator is deterministic, but a margin
this small is not resolved by one run: one repack method moved by up to 0.93% against itself when only its repack
tick moved by up to 2% (`benchmarks/rollout_resolution.py`, 7 cases x 5 workload seeds at 50 trainer steps), and
repack-program against repack-best-fit moved from -0.29% to +0.44% over those seeds (docs/rollout.md)."""


def recommend(results) -> tuple[str, str]:
    """The variant to recommend among `results` (SimResults, or anything with `variant`, `trajectories_per_s`,
    `staleness_mean`) and why: of the variants within TIE_FRAC of the fastest, the first in VARIANTS order, i.e.
    the one with fewer moving parts (sync before any asynchrony, no repack before best-fit before the program).
    Outside a tie, the fastest; its reason gives its margin over the next."""
    rs = sorted(results, key=lambda x: -x.trajectories_per_s)
    fastest = rs[0]
    tied = [x for x in rs if x.trajectories_per_s >= (1 - TIE_FRAC) * fastest.trajectories_per_s]
    order = {v: i for i, v in enumerate(VARIANTS)}
    best = min(tied, key=lambda x: order.get(x.variant, len(order)))
    reason = f"{best.trajectories_per_s:.2f} trajectories/s"
    staleness = f"mean staleness {best.staleness_mean:.2f} (max {best.staleness_max})"
    if best is not fastest:
        return best.variant, (
            reason + f"; {fastest.variant} is within {TIE_FRAC:.0%} ({fastest.trajectories_per_s:.2f}, "
            f"+{fastest.trajectories_per_s / best.trajectories_per_s - 1:.2%}), a tie at the simulator's resolution, "
            f"so the simpler policy is recommended; {staleness}")
    if len(rs) > 1:
        runner = rs[1]  # best is the fastest, rs[0]
        reason += (f", {best.trajectories_per_s / runner.trajectories_per_s:.2f}x the next best ({runner.variant}); "
                   f"{staleness}")
    return best.variant, reason


class PolicyFigures(BaseModel):
    model_config = ConfigDict(frozen=True)
    variant: str
    trajectories_per_s: float
    tokens_per_s: float
    rollout_idle_frac: float
    rollout_sync_frac: float
    rollout_migrate_frac: float
    trainer_idle_frac: float
    staleness_mean: float
    staleness_max: int
    kv_util_mean: float
    repacks: int
    moves: int
    repack_overhead_s: float
    solver_wall_ms_mean: float
    solver_wall_ms_max: float
    sim_time_s: float
    steps: int
    ceiling_tps: float | None = None
    """The proven ceiling of this policy's run (SimResult.ceiling_tps): no schedule of the trajectories it trained
    is faster under these costs."""

    @classmethod
    def of(cls, r: SimResult) -> PolicyFigures:
        return cls(**{k: v for k, v in r.row().items() if k in cls.model_fields})


class WorkerSummary(BaseModel):
    model_config = ConfigDict(frozen=True)
    group: str
    device: str
    bits: int
    count: int
    kv_capacity_tokens: float
    decode_ms_at_cap: float
    """One decode step at the batch cap, each sequence at the workload's mean context."""
    prefill_ms: float
    """Prefill of one prompt of the workload's mean length."""
    pull_s: float


class CeilingFigures(BaseModel):
    """rollout.bounds.ceiling: what no policy trains faster than, in the long run, under these costs."""

    model_config = ConfigDict(frozen=True)
    trajectories_per_s: float
    trainer_tps: float
    """The trainer's steps back to back."""
    rollout_tps: float
    """The rollouts' hardware, every decode step priced at the plane under its cost (no admission rule)."""
    bound_by: str

    @classmethod
    def of(cls, c) -> CeilingFigures:
        return cls(trajectories_per_s=c.tps, trainer_tps=c.trainer_tps, rollout_tps=c.rollout_tps,
                   bound_by=c.bound_by)


class RolloutPlan(BaseModel):
    model_config = ConfigDict(frozen=True)
    version: int = PLAN_VERSION
    name: str
    model: str
    batch: int
    """Trajectories per trainer step."""
    recommended: str
    reason: str
    spec_policy: str
    policies: list[PolicyFigures]
    workers: list[WorkerSummary]
    broadcast_s: float
    push_s: float
    steps: int
    notes: list[str] = []
    ceiling: CeilingFigures | None = None

    def figures(self, variant: str) -> PolicyFigures:
        return next(p for p in self.policies if p.variant == variant)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(self.to_json())
        return p


WORKER_MODULE = "qsync_opt.rollout.sim_worker"
"""What `simulate_variants` runs as `python -m` for a worker process."""

PARALLEL_AFTER_S = 0.5
"""`simulate_variants` runs the rest in worker processes when its first variant took at least this long: a worker
pays about 1.5 s importing the package (the CLI's Laminar example: 39 s of simulation over 7 variants)."""


def simulate_variants(job, variants=VARIANTS, processes: int | None = None, **kw) -> dict[str, SimResult]:
    """`simulate(job, v, **kw)` for every v in `variants`, in that order. The simulator is deterministic, so the
    variants are independent: the first runs here, and when it took PARALLEL_AFTER_S or more the others run in up
    to `processes` worker processes at once (default: the CPUs this process may use), the repack variants first.
    Results are those of the serial loop, value for value (wall times aside: the simulator's and its solver's are
    measured, not simulated).

    A worker is `python -m qsync_opt.rollout.sim_worker` fed by pipe, not a multiprocessing child: spawning one
    re-imports the caller's `__main__`, which re-runs a script that calls `qsync_opt.solve` without a main guard;
    a worker that fails leaves its variant to this process, which raises what it raises."""
    variants = list(variants)
    if not variants:
        return {}
    steps = kw.get("steps") or job.rollout.steps
    log.info("simulating %d policies of %s for %d trainer steps", len(variants), job.name, steps)
    t0 = time.perf_counter()
    out = {variants[0]: simulate(job, variants[0], **kw)}
    _done(variants[0], out[variants[0]])
    rest = variants[1:]
    n = processes if processes is not None else len(os.sched_getaffinity(0))
    if n < 2 or len(rest) < 2 or time.perf_counter() - t0 < PARALLEL_AFTER_S:
        for v in rest:
            out[v] = simulate(job, v, **kw)
            _done(v, out[v])
        return out
    log.info("the other %d in %d worker processes, the repack policies first", len(rest), min(n, len(rest)))
    import queue
    import threading

    todo: queue.Queue = queue.Queue()
    for v in reversed(rest):  # the repack variants, the slowest, first
        todo.put(v)
    done: dict[str, SimResult | None] = {}
    threads = [threading.Thread(target=_worker_loop, args=(job, kw, todo, done), daemon=True)
               for _ in range(min(n, len(rest)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for v in rest:
        if done.get(v) is None:
            done[v] = simulate(job, v, **kw)
            _done(v, done[v])
        out[v] = done[v]
    return out


def _done(variant: str, r: SimResult) -> None:
    """Log one policy simulated: its throughput and the wall time its simulation took here."""
    log.info("  %-17s %8.2f traj/s  simulated in %.1f s", variant, r.trajectories_per_s, r.wall_s)


def _worker_loop(job, kw: dict, todo, done: dict) -> None:
    """Feed one worker process (`qsync_opt.rollout.sim_worker`) variants from `todo` until it is empty; a variant
    the worker fails on is left out of `done` (the caller then runs it itself), and the worker is not used again."""
    import pickle
    import queue
    import subprocess
    import sys

    from qsync_opt.rollout.sim_worker import read_msg, write_msg

    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the package this process runs, not another install
    env["PYTHONPATH"] = os.pathsep.join([root, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else root
    try:
        p = subprocess.Popen([sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    except OSError:
        return
    try:
        while True:
            try:
                v = todo.get_nowait()
            except queue.Empty:
                break
            write_msg(p.stdin, pickle.dumps((job, v, kw)))
            msg = read_msg(p.stdout)
            if msg is None:
                break  # the worker died: this variant runs in the caller, the rest of the queue in other workers
            done[v] = pickle.loads(msg)
            _done(v, done[v])
    except Exception:  # noqa: BLE001 - a job that does not pickle, a worker that died: the caller runs what is left
        pass
    finally:
        try:
            p.stdin.close()  # end of input: the worker exits
        except OSError:
            pass
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def solve(job, steps: int | None = None, variants=VARIANTS, keep_results: dict | None = None,
          processes: int | None = None) -> RolloutPlan:
    """Simulate every policy variant of `job` and recommend one. `keep_results`, if a dict, receives
    variant -> SimResult (without timelines: `run_report` keeps those). `processes`: as for `simulate_variants`
    (1: everything in this process, no worker started)."""
    results = simulate_variants(job, variants, processes=processes, steps=steps, timeline_until=None)
    if keep_results is not None:
        keep_results.update(results)
    return plan_from(job, results, steps)


CUT_NOTE_FRAC = 0.01
"""A plan notes max_len when it cuts more than this share of the responses (more than a p99 tail)."""


def plan_from(job, results: dict[str, SimResult], steps: int | None = None) -> RolloutPlan:
    """The plan of `job` from its simulated variants (`simulate_variants`)."""
    from qsync_opt.rollout.simulate import _variant_of

    r = job.rollout
    recommended, reason = recommend(results.values())
    w = r.workload
    mean_prompt = w.prompt_len if isinstance(w.prompt_len, int) else w.prompt_len.mean(10**9)
    mean_ctx = mean_prompt + w.response.mean(w.max_len) / 2
    sc = sync_costs(job)
    workers = [WorkerSummary(group=c.group, device=c.device, bits=c.bits, count=c.count,
                             kv_capacity_tokens=c.kv_capacity_tokens,
                             decode_ms_at_cap=c.decode_ms(r.repack.batch_cap, r.repack.batch_cap * mean_ctx),
                             prefill_ms=c.prefill_ms(1, mean_prompt), pull_s=c.pull_s) for c in all_worker_costs(job)]
    notes = ["figures are simulator predictions under the serving cost model (rollout.costs), "
             "with a perfect length predictor for KV reservation and repack"]
    cut = w.response.cut_frac(w.max_len)
    if cut > CUT_NOTE_FRAC:
        shape = (f"the lengths file {w.response.file}" if w.response.file is not None else
                 f"median {w.response.median:g}" + (f", p99 {w.response.p99:g}" if w.response.p99 else ""))
        notes.append(f"rollout.workload.max_len {w.max_len} cuts {cut:.1%} of the responses ({shape}): they end at "
                     f"{w.max_len} tokens in every figure here; raise max_len if the policy is meant to finish them")
    return RolloutPlan(name=job.name, model=r.model.label, batch=w.batch, recommended=recommended, reason=reason,
                       spec_policy=_variant_of(job), policies=[PolicyFigures.of(x) for x in results.values()],
                       workers=workers, broadcast_s=sc.broadcast_s, push_s=sc.push_s,
                       steps=steps or r.steps, notes=notes, ceiling=CeilingFigures.of(ceiling(job, steps=steps)))


def print_plan(plan: RolloutPlan, console) -> None:
    """The plan as two rich tables: the workers' costs, and every policy side by side."""
    from rich.table import Table

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
    if plan.ceiling:
        c = plan.ceiling
        console.print(f"ceiling (proven, any policy, long run): {c.trajectories_per_s:.2f} traj/s, bound by the "
                      f"{c.bound_by} (trainer {c.trainer_tps:.2f}, rollouts' hardware {c.rollout_tps:.2f})")
    p = Table(title="policies (simulated, same costs)", title_justify="left")
    for col in ("policy", "traj/s", "tokens/s", "× sync", "of ceiling", "rollout idle", "trainer idle",
                "staleness mean/max", "KV util", "repacks", "moves", "solver ms (mean/max)"):
        p.add_column(col, justify="left" if col == "policy" else "right")
    sync = next((x for x in plan.policies if x.variant == "sync"), None)
    for x in plan.policies:
        mark = " ◀" if x.variant == plan.recommended else ""
        p.add_row(x.variant + mark, f"{x.trajectories_per_s:.2f}", f"{x.tokens_per_s:,.0f}",
                  f"{x.trajectories_per_s / sync.trajectories_per_s:.2f}" if sync else "",
                  f"{x.trajectories_per_s / x.ceiling_tps:.0%}" if x.ceiling_tps else "",
                  f"{x.rollout_idle_frac:.1%}", f"{x.trainer_idle_frac:.1%}",
                  f"{x.staleness_mean:.2f}/{x.staleness_max}", f"{x.kv_util_mean:.1%}", str(x.repacks), str(x.moves),
                  f"{x.solver_wall_ms_mean:.1f}/{x.solver_wall_ms_max:.1f}" if x.repacks else "")
    console.print(p)
    console.print(f"recommended: {plan.recommended} — {plan.reason}")
    for n in plan.notes:
        console.print(f"note: {n}")


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
               max_workers: int = 32) -> tuple[RolloutPlan, dict[str, Path]]:
    """`qsync-opt run` on a rollout spec: every policy simulated (the plan), then out_dir/plan.json, timeline.png
    and kv_utilisation.png (the variants of `pictured`) and report.md, each written whole or not at all."""
    from qsync_opt.io import atomic_write_text

    results, until = simulate_with_timelines(job, VARIANTS, steps, timeline_steps)
    plan = plan_from(job, results, steps)
    shown = pictured(plan)
    paths = draw_report(job, out_dir, {v: results[v] for v in shown}, until, timeline_steps, max_workers)
    out = Path(out_dir)
    paths["plan"] = out / "plan.json"
    atomic_write_text(paths["plan"], plan.to_json())
    paths["report"] = out / "report.md"
    atomic_write_text(paths["report"], report_markdown(plan, shown))
    return plan, paths


def write_measured(job, out_dir: str | Path, rounds: int = 1, console=None) -> dict[str, Path]:
    """Run every policy here on Ray actors `rounds` times (`ray_run.measured_vs_predicted`), write
    out_dir/measured.csv (measured beside the simulator calibrated from this run) and add the table to report.md;
    print it on `console` if given. The run's figures are this machine's, not the spec's fleet's."""
    import csv
    import io

    from qsync_opt.io import atomic_write_text
    from qsync_opt.rollout.ray_run import measured_vs_predicted

    load0 = os.getloadavg()[0]
    rows, info = measured_vs_predicted(job, rounds)
    load1 = os.getloadavg()[0]
    out = Path(out_dir)
    buf = io.StringIO()
    buf.write(f"# {job.name}: every policy on Ray actors here, {rounds} interleaved round(s), median round; load "
              f"{load0:.2f} -> {load1:.2f} on {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    buf.write(f"# calibration: {info}\n")
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    paths = {"measured": out / "measured.csv"}
    atomic_write_text(paths["measured"], buf.getvalue())
    lines = ["", f"## Measured here ({rounds} round(s) on Ray actors, load {load0:.2f} -> {load1:.2f})", "",
             "Every policy run on this machine, beside the simulator calibrated from that run (measured.csv).", "",
             "| policy | measured traj/s | predicted | off | rollout idle measured / predicted | "
             "trainer idle measured / predicted |", "|---|---|---|---|---|---|"]
    cells = [_measured_cells(r) for r in rows]
    lines += [f"| {' | '.join(c)} |" for c in cells]
    report = out / "report.md"
    atomic_write_text(report, (report.read_text() if report.exists() else "") + "\n".join(lines) + "\n")
    if console is not None:
        from rich.table import Table

        t = Table(title=f"measured here vs the calibrated simulator ({rounds} round(s), load {load0:.2f} -> "
                        f"{load1:.2f})", title_justify="left")
        for col in ("policy", "measured traj/s", "predicted", "off", "rollout idle m/p", "trainer idle m/p"):
            t.add_column(col, justify="left" if col == "policy" else "right")
        for c in cells:
            t.add_row(*c)
        console.print(t)
    return paths


def _measured_cells(r: dict) -> list[str]:
    """One row of `measured_vs_predicted` as the report's and the console's table cells."""
    return [r["policy"], f"{r['real_trajectories_per_s']:.2f}", f"{r['predicted_trajectories_per_s']:.2f}",
            f"{r['predicted_vs_real']:+.0%}",
            f"{r['real_rollout_idle_frac']:.0%} / {r['predicted_rollout_idle_frac']:.0%}",
            f"{r['real_trainer_idle_frac']:.0%} / {r['predicted_trainer_idle_frac']:.0%}"]


def report_markdown(plan: RolloutPlan, shown: list[str]) -> str:
    lines = [f"# {plan.name}: rollout plan", "",
             f"{plan.model}, {plan.batch} trajectories per trainer step, {plan.steps} trainer steps simulated.", "",
             f"**Recommended: {plan.recommended}**: {plan.reason}.", ""]
    if plan.ceiling:
        c = plan.ceiling
        lines += [f"Ceiling (proven for any policy, in the long run, under these costs): {c.trajectories_per_s:.2f} "
                  f"trajectories/s, bound by the {c.bound_by} (trainer {c.trainer_tps:.2f}, rollouts' hardware "
                  f"{c.rollout_tps:.2f}). \"of ceiling\" is each run against the ceiling of the trajectories it "
                  "trained.", ""]
    lines += ["| policy | traj/s | tokens/s | x sync | of ceiling | rollout idle | trainer idle | staleness mean / max "
              "| KV util | repacks | moves |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    sync = next((p.trajectories_per_s for p in plan.policies if p.variant == "sync"), None)
    for p in plan.policies:
        x = f"{p.trajectories_per_s / sync:.2f}" if sync else ""
        mark = " (recommended)" if p.variant == plan.recommended else ""
        share = f"{p.trajectories_per_s / p.ceiling_tps:.0%}" if p.ceiling_tps else ""
        lines.append(f"| {p.variant}{mark} | {p.trajectories_per_s:.2f} | {p.tokens_per_s:,.0f} | {x} | {share} | "
                     f"{p.rollout_idle_frac:.1%} | {p.trainer_idle_frac:.1%} | {p.staleness_mean:.2f} / "
                     f"{p.staleness_max} | {p.kv_util_mean:.1%} | {p.repacks} | {p.moves} |")
    lines += ["", "| group | device | bits | count | KV tokens | decode ms at the batch cap | prefill ms | pull s |",
              "|---|---|---|---|---|---|---|---|"]
    for w in plan.workers:
        lines.append(f"| {w.group} | {w.device} | {w.bits} | {w.count} | {w.kv_capacity_tokens:,.0f} | "
                     f"{w.decode_ms_at_cap:.1f} | {w.prefill_ms:.1f} | {w.pull_s:.2f} |")
    lines += ["", f"Weight sync: global broadcast {plan.broadcast_s:.2f} s (every rollout stalls), relay push "
              f"{plan.push_s:.2f} s (the trainer only).", "",
              f"Per-worker timeline ({', '.join(shown)}): ![timeline](timeline.png)", "",
              "KV-cache utilisation over all rollouts: ![KV utilisation](kv_utilisation.png)", ""]
    lines += [f"Note: {n}." for n in plan.notes]
    return "\n".join(lines) + "\n"


def draw_report(job, out_dir: str | Path, results: dict[str, SimResult], until: dict[str, float],
                timeline_steps: int = 4, max_workers: int = 32) -> dict[str, Path]:
    """Draw timeline.png (each variant's first `timeline_steps` trainer steps, up to `until[variant]`) and
    kv_utilisation.png for `results` (SimResults with timelines) into out_dir; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from qsync_opt.io import atomic_write_bytes

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
