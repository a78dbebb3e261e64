"""Solver benchmark: every backend on zoo-model and synthetic instances, one table, CSV and PNG.

Instances: each zoo model on three clusters (V100+T4, A100+T4, H100+L4+T4), synthetic chains
and DAGs up to 5,000 selectable ops x 5 precisions x 4 groups, and any saved problem JSON
files. Per backend: median wall time over repeats, status, objective, gap to the best
objective any backend found, and the greedy (QSync allocator) objective beside it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import InfeasibleError, QSyncError
from ..io import atomic_write_text
from .backends import EXACT, available
from .backends.base import SolveOptions
from .greedy import greedy
from .instance import TrainingInstance, evaluate
from .random_instances import synthetic
from .solve import solve_problem
from .training import compile_training

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
    from ..pipeline import prepare
    from ..predictor.instance_builder import build_instance
    from ..spec import load_spec

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


def synthetic_cases(sizes: list[int]) -> list[Case]:
    return [Case(f"{kind}-{n}", f"synthetic-{kind}", synthetic(n, 5, 4, kind, seed=1)) for n in sizes for kind in ("chain", "dag")]


def saved_cases(directory: str) -> list[Case]:
    from .export import load_problem

    return [Case(p.stem, "saved", None, load_problem(str(p))) for p in sorted(Path(directory).glob("*.json"))]


def run_case(case: Case, backend: str, limit: float, gap: float, repeats: int) -> dict:
    problem = case.problem if case.problem is not None else compile_training(case.instance)
    walls, r, status = [], None, "error"
    for _ in range(repeats):
        try:
            r = solve_problem(problem, backend, SolveOptions(time_limit_s=limit, rel_gap=gap), warm_start=False)
            status = r.status
            walls.append(r.wall_s)
        except InfeasibleError:
            status = "infeasible"
            break
        except QSyncError as e:
            status = f"error: {str(e)[:60]}"
            break
        if r.wall_s > 5:  # one run of a slow case is the measurement; repeats only tame noise
            break
    return {
        "case": case.name, "family": case.family, "size": case.size, "backend": backend, "status": status,
        "wall_s": statistics.median(walls) if walls else None, "objective": r.objective if r else None,
        "gap": r.gap if r else None,
    }


def run_benchmark(out_dir: Path, instances_dir: str | None = None, quick: bool = False,
                  models: list[str] | None = None, sizes: list[int] | None = None,
                  backends: list[str] | None = None, limit: float = 60.0, gap: float = 1e-3) -> list[dict]:
    from ..models.zoo import list_models

    console = Console()
    ok = available()
    backends = [b for b in (backends or [*EXACT, "greedy"]) if ok.get(b)]
    if models is None:
        models = ["tiny-cnn", "resnet18", "resnet50", "bert-base"] if quick else list_models()
    sizes = sizes or ([50, 200, 1000] if quick else [50, 200, 1000, 5000])
    console.print(f"building instances: {len(models)} models x {len(CLUSTERS)} clusters, synthetic sizes {sizes}")
    cases = zoo_cases(models) + synthetic_cases(sizes) + (saved_cases(instances_dir) if instances_dir else [])
    rows = []
    for case in cases:
        g = greedy(case.instance) if case.instance is not None else None
        case_rows = []
        for b in backends:
            t0 = time.perf_counter()
            row = run_case(case, b, limit, gap, repeats=1 if quick else 3)
            row["greedy_objective"] = (evaluate(case.instance, g.assignment).objective(case.instance)
                                       if g is not None and g.feasible else None)
            case_rows.append(row)
            console.print(f"  {case.name:28s} {b:7s} {row['status']:10s} {row['wall_s'] or 0:8.3f}s  ({time.perf_counter() - t0:.1f}s)")
        best = min((r["objective"] for r in case_rows if r["objective"] is not None and r["status"] in ("optimal", "feasible")), default=None)
        for r in case_rows:
            r["gap_to_best"] = None if best is None or r["objective"] is None else (r["objective"] - best) / max(abs(best), 1e-12)
        rows.extend(case_rows)
    _write(rows, out_dir, console)
    return rows


def _write(rows: list[dict], out_dir: Path, console: Console) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    cols = ["case", "family", "size", "backend", "status", "wall_s", "objective", "gap", "gap_to_best", "greedy_objective"]
    lines = [",".join(cols)] + [",".join("" if r.get(c) is None else str(r[c]) for c in cols) for r in rows]
    atomic_write_text(out_dir / "solvers.csv", "\n".join(lines) + "\n")
    t = Table(title="solver benchmark (wall s; gap_to_best vs the best objective any backend found)", title_justify="left")
    for c in ("case", "size", "backend", "status", "wall s", "gap to best", "greedy / best"):
        t.add_column(c, justify="left" if c in ("case", "backend", "status") else "right")
    for r in rows:
        gb = "" if r["gap_to_best"] is None else f"{r['gap_to_best']:.2%}"
        best = r["objective"] / (1 + r["gap_to_best"]) if r["gap_to_best"] is not None else None
        gr = "" if not (r["greedy_objective"] and best) else f"{r['greedy_objective'] / best:.3f}x"
        t.add_row(r["case"], str(r["size"]), r["backend"], r["status"], "" if r["wall_s"] is None else f"{r['wall_s']:.3f}", gb, gr)
    console.print(t)
    _plot(rows, out_dir / "solvers.png")
    console.print(f"wrote {out_dir / 'solvers.csv'} and {out_dir / 'solvers.png'}")


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, family in zip(axes, ("synthetic-chain", "synthetic-dag")):
        for b in sorted({r["backend"] for r in rows}):
            pts = sorted((r["size"], r["wall_s"]) for r in rows if r["family"] == family and r["backend"] == b and r["wall_s"])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=b)
        ax.set(xscale="log", yscale="log", xlabel="selectable ops per group (x5 precisions x4 groups)", title=family)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("wall time to gap, s")
    axes[0].legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
