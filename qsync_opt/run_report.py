"""The report of `qsync-opt run`: Markdown with the plan, the predicted timeline against the measured
step time, the policies, training and test curves, and PNGs."""

from __future__ import annotations

import json
from pathlib import Path

from qsync_opt.data.evaluation import read_eval
from qsync_opt.io import atomic_write_text
from qsync_opt.plan import Plan
from qsync_opt.precision import PRECISIONS
from qsync_opt.spec import JobSpec

COLOURS = {"fp32": "#1f4e79", "tf32": "#2e75b6", "bf16": "#70ad47", "fp16": "#a9d18e", "fp8_e4m3": "#ffc000",
           "fp8_e5m2": "#ffd966", "int8": "#ed7d31", "int4": "#c00000"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def precision_strip(plan: Plan, path: Path) -> Path:
    """One row per group, one cell per selectable operator in network order, coloured by precision."""
    plt = _plt()
    groups = list(plan.groups)
    n = max(len(g.precisions) for g in plan.groups.values())
    fig, ax = plt.subplots(figsize=(max(6, n * 0.25), 0.6 * len(groups) + 1.2))
    for row, name in enumerate(groups):
        for col, p in enumerate(plan.groups[name].precisions.values()):
            ax.add_patch(plt.Rectangle((col, row), 1, 0.9, color=COLOURS[p]))
    ax.set_xlim(0, n)
    ax.set_ylim(0, len(groups))
    ax.set_yticks([r + 0.45 for r in range(len(groups))], groups)
    ax.set_xlabel("selectable operators, input to output")
    used = [p for p in PRECISIONS if any(p in g.precisions.values() for g in plan.groups.values())]
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=COLOURS[p]) for p in used], labels=used,
              loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=len(used), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curves(steps: list[dict], evals: list[dict], path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], label="train loss (global batch)", color="#2e75b6")
    if evals:
        ax.plot([e["step"] for e in evals], [e["test_loss"] for e in evals], "o-", label="test loss", color="#ed7d31")
        ax2 = ax.twinx()
        ax2.plot([e["step"] for e in evals], [100 * e["test_accuracy"] for e in evals], "s--", color="#70ad47",
                 label="test accuracy %")
        ax2.set_ylabel("test accuracy %")
        ax2.legend(loc="center right", fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(spec: JobSpec, plan: Plan, metrics: Path, out: Path) -> Path:
    rank0 = metrics / "rank0.jsonl"
    records = [json.loads(x) for x in rank0.read_text().splitlines()] if rank0.exists() else []
    steps = {r["step"]: r for r in records if "loss" in r}
    steps = [steps[s] for s in sorted(steps)]
    evals = read_eval(metrics)
    precision_strip(plan, out / "precisions.png")
    curves(steps, evals, out / "curves.png")
    lines = [f"# {spec.name}: {plan.model}", "",
             f"Cluster: {', '.join(f'{g.name} = {g.count}x {g.device_spec.name}' for g in spec.cluster.groups)}; "
             f"objective {plan.objective}; solver {plan.solver.backend} ({plan.solver.status}).", "",
             "## Plan", "", "| group | device | batch | ops per precision | iter ms | bound ms | indicator |",
             "|---|---|---|---|---|---|---|"]
    for n, g in plan.groups.items():
        mix = " ".join(f"{p}:{c}" for p, c in g.counts().items())
        bound = "-" if g.time_bound_ms is None else f"{g.time_bound_ms:.3f}"
        lines.append(f"| {n} | {g.count}x {g.device} | {g.local_batch} | {mix} | {g.iteration_ms:.3f} | {bound} | {g.indicator:.4g} |")
    lines += ["", "![precision per operator and group](precisions.png)", "",
              *_prediction_lines(out, metrics),
              "## Policies (predicted for the cluster)", "", "| policy | iteration ms | indicator | meets bounds |",
              "|---|---|---|---|", f"| **this plan** | {plan.iteration_ms:.3f} | {plan.indicator:.4g} | - |"]
    for name, b in plan.baselines.items():
        lines.append(f"| {name} | {b.iteration_ms:.3f} | {b.indicator:.4g} | {'yes' if b.feasible else 'no'} |")
    lines += ["", "## Training (measured here)", ""]
    if steps:
        lines.append(f"{len(steps)} steps: loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}.")
    if evals:
        e = evals[-1]
        lines.append(f"Test set after step {e['step']}: accuracy {100 * e['test_accuracy']:.2f}%, loss {e['test_loss']:.4f} "
                     f"({e['test_samples']} samples).")
    lines += ["", "![training and test curves](curves.png)", ""]
    for note in plan.solver.notes:
        lines.append(f"- note: {note}")
    return atomic_write_text(out / "report.md", "\n".join(lines) + "\n")


def _load(x) -> str:
    return f"{x[0]:.2f}" if x else "-"


def _prediction_lines(out: Path, metrics: Path) -> list[str]:
    """Predicted (replayer) against measured (train) iteration time, each with the load it was made under."""
    from qsync_opt.run_stages import measured_iteration_ms

    pred_path = out / "predict.json"
    if not pred_path.exists():
        return []
    pred = json.loads(pred_path.read_text())
    costs = sorted({g["costs"].split(" (")[0] for g in pred["groups"].values()})
    measured = measured_iteration_ms(metrics)
    load_path, prof_path = metrics / "load.json", out / "profile.json"
    load = json.loads(load_path.read_text()) if load_path.exists() else {}
    prof = json.loads(prof_path.read_text()) if prof_path.exists() else {}
    if prof.get("profiled"):
        pred_load = f"{_load(prof.get('load_before'))} -> {_load(prof.get('load_after'))} (profiled in this run)"
    elif "measured" in costs:
        pred_load = "- (costs from a profile measured before this run)"
    else:
        pred_load = "- (no measured costs)"
    lines = ["## Iteration time: predicted against measured", "",
             "| | ms per iteration | machine load (1-min) |", "|---|---|---|",
             f"| predicted (replayer; costs {', '.join(costs)}) | {pred['iteration_ms']:.2f} | {pred_load} |"]
    if measured:
        ms, n = measured
        lines.append(f"| measured (train: median of {n} steps, slowest rank) | {ms:.2f} | "
                     f"{_load(load.get('before'))} -> {_load(load.get('after'))} |")
        lines += ["", f"Measured / predicted: {ms / pred['iteration_ms']:.2f}x. Training shares this machine's cores "
                  "with every rank (and anything else running), so the measured time moves with the load."]
    lines += ["", "![predicted timeline](timeline.png)", "",
              f"Chrome trace of the prediction: [{pred['trace']}]({pred['trace']}) (opens in https://ui.perfetto.dev).", ""]
    return lines
