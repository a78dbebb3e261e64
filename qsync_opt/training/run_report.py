"""The report of `qsync-opt run`: Markdown with the plan, the predicted timeline against the measured
step time, the policies, training and test curves, and PNGs."""

from __future__ import annotations

import json
from pathlib import Path

from qsync_opt.data.evaluation import read_eval
from qsync_opt.io import atomic_write_text
from qsync_opt.training.plan import Plan
from qsync_opt.training.pictures import curves, precision_strip
from qsync_opt.training.spec import JobSpec


def write_report(spec: JobSpec, plan: Plan, metrics: Path, out: Path) -> Path:
    rank0 = metrics / "rank0.jsonl"
    records = [json.loads(x) for x in rank0.read_text().splitlines()] if rank0.exists() else []
    steps = {r["step"]: r for r in records if "loss" in r}
    steps = [steps[s] for s in sorted(steps)]
    evals = read_eval(metrics)
    precision_strip(plan, out / "precisions.png", [g.name for g in spec.cluster.groups])
    curves(steps, evals, out / "curves.png", f"{spec.name}: training loss and test accuracy ({plan.model})")
    lines = [f"# {spec.name}: {plan.model}", "",
             f"Cluster: {', '.join(f'{g.name} = {g.count}x {g.device_spec.name}' for g in spec.cluster.groups)}; "
             f"objective {plan.objective}; solver {plan.solver.backend} ({plan.solver.status}).", "",
             "## Plan", "", "| group | device | batch | ops per precision | iter ms | bound ms | Σω (group, unweighted) |",
             "|---|---|---|---|---|---|---|"]
    for n, g in plan.groups.items():
        mix = " ".join(f"{p}:{c}" for p, c in g.counts().items())
        bound = "-" if g.time_bound_ms is None else f"{g.time_bound_ms:.3f}"
        lines.append(f"| {n} | {g.count}x {g.device} | {g.local_batch} | {mix} | {g.iteration_ms:.3f} | {bound} | {g.indicator:.4g} |")
    lines += ["", "![precision per operator and group](precisions.png)", "",
              *_prediction_lines(out, metrics),
              "## Policies (predicted for the cluster)", "",
              "Σ share·ω: each group's Σω weighted by its share of the global batch (what the solver minimises).", "",
              "| policy | iteration ms | Σ share·ω | meets bounds |",
              "|---|---|---|---|", f"| **this plan** | {plan.iteration_ms:.3f} | {plan.indicator:.4g} | - |"]
    for name, b in plan.baselines.items():
        lines.append(f"| {name} | {b.iteration_ms:.3f} | {b.indicator:.4g} | {'yes' if b.feasible else 'no'} |")
    lines += ["", "## Training (measured here)", ""]
    if steps:
        lines.append(f"{len(steps)} steps: loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}.")
    if evals:
        e = evals[-1]
        from qsync_opt.data.majority import majority_rate
        from qsync_opt.data.task import build_task

        ppl = f", perplexity {e['test_perplexity']:.3f}" if e.get("test_perplexity") is not None else ""
        rate, classes = majority_rate(build_task(spec))
        lines.append(f"Test set after step {e['step']}: accuracy {100 * e['test_accuracy']:.2f}%, loss {e['test_loss']:.4f}{ppl} "
                     f"({e['test_samples']} samples{', tokens' if ppl else ''}); always answering the most frequent of "
                     f"its {classes} labels would score {100 * rate:.2f}%.")
    lines += ["", "![training and test curves](curves.png)", ""]
    from qsync_opt.training.report import user_notes

    shown, internal = user_notes(plan.solver.notes)
    lines += [f"- note: {note}" for note in shown]
    if internal:
        lines += ["", "<details><summary>solver details</summary>", "", *(f"- {n}" for n in internal), "", "</details>"]
    return atomic_write_text(out / "report.md", "\n".join(lines) + "\n")


def _load(x) -> str:
    return f"{x[0]:.2f}" if x else "-"


def _prediction_lines(out: Path, metrics: Path) -> list[str]:
    """Predicted (replayer) against measured (train) iteration time, each with the load it was made under."""
    from qsync_opt.training.run_stages import measured_iteration_ms

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
    emu_path = metrics / "emulation.json"
    emulated = json.loads(emu_path.read_text()) if emu_path.exists() else []
    if measured:
        ms, n = measured
        where = "emulated on this CPU" if emulated else "train"
        lines.append(f"| measured ({where}: median of {n} steps, slowest rank) | {ms:.2f} | "
                     f"{_load(load.get('before'))} -> {_load(load.get('after'))} |")
        if emulated:  # two machines: a ratio of the two would read as the predictor's error
            groups = ", ".join(f"{e['group']} ({e['device']})" for e in emulated)
            lines += ["", (f"Not comparable: the prediction is for the spec's devices, but {groups} ran emulated "
                           "on this machine's CPU, so the measured time is the CPU's. Run on the devices to check "
                           "the prediction.")]
        else:
            lines += ["", (f"Measured / predicted: {ms / pred['iteration_ms']:.2f}x. Training shares this machine's "
                           "cores with every rank (and anything else running), so the measured time moves with the load.")]
    lines += ["", "![predicted timeline](timeline.png)", "",
              f"Chrome trace of the prediction: [{pred['trace']}]({pred['trace']}) (opens in https://ui.perfetto.dev).", ""]
    return lines


def write_stopped_report(spec: JobSpec, out: Path, *, stage: str, signal: str, detail: str | None,
                         command: str) -> Path:
    """report.md of a run that a signal stopped in `stage`: it says so, what was kept and the
    command that continues; it reports no figures (an earlier complete report would be stale)."""
    lines = [f"# {spec.name}: stopped", "",
             f"Status: **stopped** by {signal} during stage `{stage}`; this run is not complete and this report "
             "holds no figures." + (f" {detail[0].upper()}{detail[1:]}." if detail else ""), "",
             f"Continue with `{command}`: the stages before `{stage}` are reused"
             + (" and training resumes from its newest checkpoint, training only the remaining steps."
                if stage == "train" and detail and "checkpoint" in detail else "."), ""]
    return atomic_write_text(out / "report.md", "\n".join(lines))
