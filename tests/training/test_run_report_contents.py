"""The training run's report.md says what happened: which data it trained on, the test set in the right units, the
data plane's split when there was one, and the same "meets bounds" as `qsync-opt solve`'s table. Rendered from a
constructed plan and metrics folder: no training."""

from __future__ import annotations

import io
import json

from rich.console import Console

from qsync_opt import load_spec
from qsync_opt.training.plan import (
    DataPlaneGroup,
    DataPlanePlan,
    GroupPlan,
    Plan,
    Provenance,
    SolverReport,
)
from qsync_opt.training.report import baseline_table
from qsync_opt.training.run_report import write_report

CPU_TINY = "examples/cpu_tiny.yaml"
SOURCES = "examples/cpu_tiny_gpt2_sources.yaml"


def _plan(spec, meets_bounds: bool = True, data_plane: DataPlanePlan | None = None) -> Plan:
    groups = {g.name: GroupPlan(device=g.device_spec.name, count=1, local_batch=8, precisions={"fc": "fp32"},
                                compute_ms=1.0, comm_exposed_ms=0.0, iteration_ms=1.0, peak_memory_bytes=1.0,
                                memory_capacity_bytes=1e9, indicator=0.0) for g in spec.cluster.groups}
    return Plan(job=spec.name, model=spec.model.name, objective="iteration_time", groups=groups, iteration_ms=1.0,
                indicator=0.0, solver=SolverReport(backend="t", status="optimal", objective=1.0, wall_s=0.0),
                provenance=Provenance(spec_digest="t", versions={}), meets_bounds=meets_bounds,
                data_plane=data_plane)


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_report_names_synthetic_data_and_why_its_loss_may_stay_flat(tmp_path):
    spec = load_spec(CPU_TINY, data={"name": "synthetic", "kwargs": {"test_samples": 128}})
    metrics = tmp_path / "train"
    metrics.mkdir()
    _jsonl(metrics / "rank0.jsonl", [{"step": 1, "loss": 2.30, "step_ms": 1.0}, {"step": 2, "loss": 2.30, "step_ms": 1.0}])
    _jsonl(metrics / "eval.jsonl", [{"step": 2, "train_loss": 2.3, "test_loss": 2.3, "test_accuracy": 0.1,
                                     "test_samples": 128}])
    report = write_report(spec, _plan(spec), metrics, tmp_path).read_text()
    data = next(x for x in report.splitlines() if x.startswith("Data: "))
    assert data.startswith("Data: synthetic: random inputs, each labelled by a frozen teacher")
    assert "a flat loss here is not by itself a fault" in data
    line = next(x for x in report.splitlines() if x.startswith("Test set after step 2"))
    assert line.startswith("Test set after step 2 (128 samples): accuracy 10.00%, loss 2.3000;")


def test_a_language_models_test_set_is_in_tokens_and_the_data_plane_split_is_shown(tmp_path):
    spec = load_spec(SOURCES)
    groups = {g: DataPlaneGroup(speed=s, seconds_per_flop=1e-9, c0=0.0, a=1e-5, b=1e-8)
              for g, s in (("native", 1.0), ("sse41", 0.25))}
    dp = DataPlanePlan(policy="ours", balance="attention", reference_length=64, flops_a=1.0, flops_b=1.0,
                       speeds_from="constructed", groups=groups, loader_cpus=2, loader_workers={"short": 1, "long": 1},
                       preprocess_ms={"short": 0.01, "long": 0.01}, demand_samples_per_s={"short": 1.0, "long": 1.0},
                       supply_ratio=10.0, sizing_status="optimal")
    metrics = tmp_path / "train"
    metrics.mkdir()
    for rank, group, samples, tokens, pred in ((0, "native", 13, 800, 9.0), (1, "sse41", 3, 200, 10.0)):
        _jsonl(metrics / f"rank{rank}.jsonl", [
            {"event": "start", "rank": rank},
            *({"step": k, "loss": 3.0, "local_loss": 3.0, "step_ms": 50.0 + k, "group": group, "samples": samples,
               "tokens": tokens, "global_tokens": 1000, "global_targets": 984, "predicted_ms": pred,
               "predicted_slowest_ms": 10.0, "plan_ms": 0.1} for k in (1, 2, 3))])
    _jsonl(metrics / "eval.jsonl", [{"step": 3, "train_loss": 3.0, "test_loss": 2.9368, "test_accuracy": 0.298,
                                     "test_samples": 19648, "test_perplexity": 18.858}])
    report = write_report(spec, _plan(spec, data_plane=dp), metrics, tmp_path).read_text()
    assert "(19648 samples, tokens)" not in report
    line = next(x for x in report.splitlines() if x.startswith("Test set after step 3"))
    assert line.startswith("Test set after step 3 (19,648 test tokens): next-token accuracy 29.80%, loss 2.9368 per "
                           "token, perplexity 18.858; always answering the most frequent of its")
    assert "distinct tokens would score" in line
    assert next(x for x in report.splitlines() if x.startswith("Data: ")).startswith(
        "Data: pysource: the Python standard library's own *.py files as bytes")
    assert "from 2 sources mixed by weight: short (pysource-lm, weight 3), long (pysource-lm, weight 1)" in report
    assert "## Data plane (measured here)" in report
    assert "| 0 | native | 3 | 39 | 2,400 | 80.0% | 80.0% | 9.00 | 52.00 |" in report
    assert "| 1 | sse41 | 3 | 9 | 600 | 20.0% | 20.0% | 10.00 | 52.00 |" in report
    assert "Predicted balance: the slowest rank's predicted time over the ranks' mean, 1.053 on average over 3 steps" \
        in report
    assert "- token share:" in report and "- predicted ms/step:" in report
    for col in ("batch", "ops per precision", "iter ms", "bound ms", "Σω (group)"):  # the plan table's columns
        assert f"\n- {col}: " in report, col


def test_a_run_without_a_data_plane_has_no_data_plane_section(tmp_path):
    spec = load_spec(CPU_TINY, data={"name": "synthetic", "kwargs": {"test_samples": 64}})
    metrics = tmp_path / "train"
    metrics.mkdir()
    _jsonl(metrics / "rank0.jsonl", [{"step": 1, "loss": 2.3, "step_ms": 1.0}])
    assert "## Data plane" not in write_report(spec, _plan(spec), metrics, tmp_path).read_text()


def test_meets_bounds_is_the_same_in_report_md_and_the_cli_table(tmp_path):
    spec = load_spec(CPU_TINY, data={"name": "synthetic", "kwargs": {"test_samples": 64}})
    metrics = tmp_path / "train"
    metrics.mkdir()
    for meets, cell in ((True, "yes"), (False, "no (see notes)")):
        plan = _plan(spec, meets_bounds=meets)
        report = write_report(spec, plan, metrics, tmp_path).read_text()
        assert f"| **this plan** | 1.000 | 0 | {cell} |" in report
        assert "meets bounds: whether the policy meets every time bound" in report
        buf = io.StringIO()
        Console(file=buf, width=300).print(baseline_table(plan))
        row = next(x for x in buf.getvalue().splitlines() if "this plan" in x)
        assert cell in row


def test_a_spec_without_data_says_it_trained_on_the_synthetic_default():
    from qsync_opt.training.run_report import data_lines

    assert data_lines(load_spec(CPU_TINY))[0].startswith(
        "Data: synthetic (the default: the spec has no `data` section): random inputs, each labelled by a frozen teacher")
