"""Solver benchmark (`qsync-opt bench solvers`, benchmarks/solvers.py): one table, CSV and PNG.

Instances: zoo models on three clusters (V100+T4, A100+T4, H100+L4+T4), synthetic chains
and DAGs up to 5,000 selectable ops x 5 precisions x 4 groups, and any saved problem files.
Per backend and formulation: build and solve time to the gap (median over repeats), the
status `solve_problem` signs, objective, proven bound, and the greedy (QSync allocator)
objective beside it. The CSV starts with the command and the machine load, and each row is
flushed as it is measured, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import csv
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from qsync_opt.console import make_console
from qsync_opt.errors import InfeasibleError, QSyncError
from qsync_opt.solver.backends import EXACT, available
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.training.program.greedy import greedy
from qsync_opt.training.program.instance import TrainingInstance, evaluate
from qsync_opt.training.program.random_instances import synthetic
from qsync_opt.training.program.bounded import applies
from qsync_opt.training.program.decompose import separable
from qsync_opt.training.program.solve import solve_instance, solve_problem
from qsync_opt.training.program.compile import compile_training
from qsync_opt.models.zoo import list_models
from qsync_opt.solver.budget import DEFAULT_TIME_LIMIT_S, Budget
from qsync_opt.solver.files import load_problem
from qsync_opt.training.pipeline import prepare
from qsync_opt.training.predictor.instance_builder import build_instance
from qsync_opt.training.spec import load_spec

#: (group, device, count, role, per-device batch). Faster devices carry larger local batches,
#: as a scheduler would give them, so the inference GPUs can keep pace at some precision mix.
CLUSTERS = {
    "v100+t4": [("v100", "V100-32GB", 4, "training", 32), ("t4", "T4", 4, "inference", 32)],
    "a100+t4": [("a100", "A100-40GB", 2, "training", 64), ("t4", "T4", 2, "inference", 16)],
    "h100+l4+t4": [("h100", "H100-SXM", 1, "training", 128), ("l4", "L4", 2, "inference", 32), ("t4", "T4", 2, "inference", 16)],
}


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    instance: TrainingInstance | None
    problem: object | None = None

    @property
    def size(self) -> int:
        if self.instance is not None:
            return max(len(g.allowed) for g in self.instance.groups)
        return len(self.problem.choices)


def zoo_cases(models: list[str]) -> list[Case]:
    cases = []
    for model in models:
        prepared = None
        for cname, groups in CLUSTERS.items():
            spec = load_spec({
                "name": f"{model}@{cname}",
                "cluster": {"groups": [{"name": n, "device": d, "count": c, "role": r, "local_batch": b}
                                       for n, d, c, r, b in groups],
                            "interconnect": "ethernet-100g"},
                "model": {"name": model},
                "training": {"global_batch": sum(c * b for _, _, c, _, b in groups),
                             "seq_len": 128 if model.startswith("gpt2") else None},
            })
            prepared = prepared or prepare(spec)
            inst, _ = build_instance(spec, prepared.graph, prepared.sensitivity, boundary=spec.runtime.boundary)
            cases.append(Case(f"{model}@{cname}", "zoo", inst))
    return cases


def synthetic_cases(sizes: list[int], kinds: list[str] | None = None) -> list[Case]:
    return [Case(f"{kind}-{n}", f"synthetic-{kind}", synthetic(n, 5, 4, kind, seed=1))
            for n in sizes for kind in (kinds or ["chain", "dag"])]


def saved_cases(directory: str) -> list[Case]:
    return [Case(p.stem, "saved", None, load_problem(str(p))) for p in sorted(Path(directory).glob("*.json"))]


COLUMNS = ["case", "family", "size", "backend", "lagrangian", "status", "wall_s", "build_s", "solve_s", "formulation",
           "objective", "bound", "gap", "greedy_objective", "greedy_over_objective", "per_group", "binaries",
           "binaries_left", "load1"]
MIP_ONLY = "-mip"
"""Backend-name suffix for the run without the Lagrangian stage (training/program/bounded.py): 'highs-mip'."""


def split_backend(name: str) -> tuple[str, bool]:
    """('highs', True) for 'highs'; ('highs', False) for 'highs-mip'."""
    return (name[: -len(MIP_ONLY)], False) if name.endswith(MIP_ONLY) else (name, True)


def run_case(case: Case, backend: str, limit: float, gap: float, repeats: int, formulation: str = "mccormick",
             problem=None) -> dict:
    """One backend on one case: median wall over repeats; statuses as `solve_problem` signs them.

    build_s counts linearising and loading the solver; compiling the instance (shared by every
    backend) is timed once per case and reported in the log line."""
    label = backend
    backend, lagrangian = split_backend(backend)
    per_group = case.instance is not None and backend in EXACT and (
        separable(case.instance) or (lagrangian and applies(case.instance)))
    if problem is None and not per_group:
        problem = case.problem if case.problem is not None else compile_training(case.instance)
    walls, r, status = [], None, "error"
    for _ in range(repeats):
        try:
            if per_group:
                # what users get: a separable instance is solved one group at a time (training/program/decompose.py),
                # each from a Lagrangian bound, plan and fixing (training/program/bounded.py) unless the name says -mip
                r = solve_instance(case.instance, backend, time_limit_s=limit, rel_gap=gap, threads=1,
                                   formulation=formulation, tie_break=False, lagrangian=lagrangian)
            else:
                r = solve_problem(problem, backend, SolveOptions(time_limit_s=limit, rel_gap=gap, threads=1,
                                                                 formulation=formulation))
            status = r.status
            walls.append((r.build_s + r.solve_s, r.build_s, r.solve_s))
        except InfeasibleError:
            status = "infeasible"
            break
        except QSyncError as e:
            status = f"error: {str(e).splitlines()[0][:60]}"
            break
        if r.wall_s > 5:  # one run of a slow case is the measurement; repeats only tame noise
            break
    mid = sorted(walls)[len(walls) // 2] if walls else (None, None, None)
    return {
        "case": case.name, "family": case.family, "size": case.size, "backend": label, "status": status,
        "lagrangian": lagrangian and per_group,
        "binaries": r.problem_stats.get("binaries") if r and walls else None,
        "binaries_left": r.problem_stats.get("binaries_left") if r and walls else None,
        "wall_s": mid[0], "build_s": mid[1], "solve_s": mid[2], "formulation": formulation,
        "objective": r.objective if r and walls else None, "bound": r.bound if r and walls else None,
        "gap": r.gap if r and walls else None,
        "per_group": per_group,
    }


def run_benchmark(out_dir: Path, instances_dir: str | None = None, quick: bool = False,
                  models: list[str] | None = None, sizes: list[int] | None = None,
                  backends: list[str] | None = None, limit: float = DEFAULT_TIME_LIMIT_S, gap: float = 1e-3,
                  formulations: list[str] | None = None, kinds: list[str] | None = None,
                  command: str | None = None, name: str = "solvers", limit_check: float | None = None) -> list[dict]:
    """Every case x formulation x backend; each CSV row is written (and flushed) as soon as it is measured."""
    console = make_console()
    ok = available()
    backends = [b for b in (backends or [*EXACT, "greedy"]) if ok.get(split_backend(b)[0])]
    formulations = formulations or ["mccormick"]
    if models is None:
        models = ["resnet18"] if quick else list_models_default()
    models = [m for m in models if m != "none"]
    if quick and limit == DEFAULT_TIME_LIMIT_S:
        limit = 5.0
    if quick and limit_check is None:
        limit_check = 0.05
    sizes = sizes or ([50, 300] if quick else [50, 200, 1000, 5000])
    console.print(f"machine load (1/5/15 min): {_load()}  cores: {os.cpu_count()}")
    console.print(f"building instances: {len(models)} models x {len(CLUSTERS)} clusters, synthetic sizes {sizes}")
    cases = zoo_cases(models) + synthetic_cases(sizes, kinds) + (saved_cases(instances_dir) if instances_dir else [])
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / f"{name}.csv"
    rows = []
    with open(csv_path, "w", encoding="utf-8", newline="") as f:
        f.write(f"# command: {command or 'qsync-opt bench solvers'}\n")
        f.write(f"# started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; load at start {_load()}; "
                f"{os.cpu_count()} cores; limit {limit} s, gap {gap}, threads 1, warm start on (as users get it), no tie-break; "
                f"backend NAME-mip: without the Lagrangian stage (greedy warm start, whole-group MIP)\n")
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        f.flush()
        for case in cases:
            t0 = time.perf_counter()
            problem = case.problem
            if problem is None and not all(b in EXACT and (separable(case.instance) or applies(case.instance))
                                           for b in map(lambda n: split_backend(n)[0], backends)):
                problem = compile_training(case.instance)  # once for the backends that take the whole program
            if problem is not None:
                console.print(f"  {case.name}: compiled in {time.perf_counter() - t0:.2f}s, {problem.stats()}")
            t0 = time.perf_counter()
            g = greedy(case.instance) if case.instance is not None else None
            if g is not None:
                console.print(f"  {case.name}: QSync's greedy in {time.perf_counter() - t0:.2f}s")
            g_obj = evaluate(case.instance, g.assignment).objective(case.instance) if g is not None and g.feasible else None
            for formulation in formulations:
                for b in backends:
                    row = run_case(case, b, limit, gap, repeats=1 if quick else 3, formulation=formulation, problem=problem)
                    row["greedy_objective"] = g_obj
                    row["greedy_over_objective"] = (g_obj / row["objective"] if g_obj and row["objective"] else None)
                    row["load1"] = round(os.getloadavg()[0], 2)
                    w.writerow(row)
                    f.flush()
                    rows.append(row)
                    console.print(f"  {case.name:24s} {formulation:9s} {b:7s} {row['status']:10s} "
                                  f"build {row['build_s'] or 0:7.2f}s solve {row['solve_s'] or 0:7.2f}s  load {row['load1']}")
        if limit_check:
            for row in limit_rows(max((n for n in sizes if n <= 1000), default=sizes[0]), limit_check):
                row["load1"] = round(os.getloadavg()[0], 2)
                w.writerow(row)
                f.flush()
                rows.append(row)
                console.print(f"  {row['case']:24s} wall {row['wall_s']:.3f}s = build {row['build_s']:.3f}s + solve "
                              f"{row['solve_s']:.3f}s (+ the rest: greedy, decode) -> {row['status']}")
    _table(rows, console)
    _plot(rows, out_dir / f"{name}.png")
    console.print(f"machine load at the end: {_load()}")
    console.print(f"wrote {csv_path} and {out_dir / f'{name}.png'}")
    return rows


def limit_rows(n: int, limit: float) -> list[dict]:
    """The whole call under a tiny limit, on a DAG with no plan (bounds halved): wall vs limit + build.

    The diagnosis of the missing plan draws on the same budget, so the row shows whether the whole call keeps to
    it (docs/program.md)."""
    from dataclasses import replace

    inst = synthetic(n, 5, 4, "dag", seed=1)
    inst = replace(inst, groups=tuple(replace(g, time_bound_ms=g.time_bound_ms * 0.5) for g in inst.groups))
    out = []
    for backend in ("highs",):
        budget = Budget(limit)
        t0 = time.perf_counter()
        try:
            solve_instance(inst, backend=backend, threads=1, budget=budget)
            status = "plan?!"
        except InfeasibleError:
            status = "infeasible"
        except QSyncError:
            status = "unknown"
        wall = time.perf_counter() - t0
        out.append({"case": f"dag-{n} no plan, limit {limit:g}s", "family": "limit", "size": n, "backend": backend,
                    "status": status, "wall_s": wall, "build_s": budget.build_s, "solve_s": budget.spent_s,
                    "formulation": "mccormick", "objective": None, "bound": None, "gap": None})
    return out


def list_models_default() -> list[str]:
    return list_models()


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _table(rows: list[dict], console: Console) -> None:
    best = {}
    for r in rows:
        if r["objective"] is not None and r["status"] in ("optimal", "feasible"):
            best[r["case"]] = min(best.get(r["case"], r["objective"]), r["objective"])
    t = Table(title="solver benchmark (build + solve s to the gap; gap to best = vs the best objective any backend found)",
              title_justify="left")
    for c in ("case", "size", "formulation", "backend", "status", "build s", "solve s", "gap", "gap to best", "greedy / best"):
        t.add_column(c, justify="left" if c in ("case", "formulation", "backend", "status") else "right")
    for r in rows:
        b = best.get(r["case"])
        gb = "" if b is None or r["objective"] is None else f"{(r['objective'] - b) / max(abs(b), 1e-18):.2%}"
        gr = "" if not (r.get("greedy_objective") and b) else f"{r['greedy_objective'] / b:.3f}x"
        t.add_row(r["case"], str(r["size"]), r["formulation"], r["backend"], r["status"],
                  "" if r["build_s"] is None else f"{r['build_s']:.2f}", "" if r["solve_s"] is None else f"{r['solve_s']:.2f}",
                  "" if r["gap"] is None else f"{r['gap']:.2%}", gb, gr)
    console.print(t)


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, family in zip(axes, ("synthetic-chain", "synthetic-dag")):
        many = len({r["formulation"] for r in rows}) > 1
        for b, form in sorted({(r["backend"], r["formulation"]) for r in rows}):
            pts = sorted((r["size"], r["wall_s"]) for r in rows
                         if r["family"] == family and r["backend"] == b and r["formulation"] == form and r["wall_s"])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{b} ({form})" if many else b)
        ax.set(xscale="log", yscale="log", xlabel="selectable ops per group (x5 precisions x4 groups)", title=family)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("wall time to gap, s")
    axes[0].legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
