"""The report's pictures say what they show: names, titles, scales, legends of what occurs.

Each test captures the matplotlib figure as it is saved and reads it back (titles, tick labels,
axis limits, legend entries): what a user would read off the PNG."""

from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
from matplotlib.figure import Figure

from qsync_opt.training.plan import GroupPlan, Plan, Provenance, SolverReport
from qsync_opt.training.run_report import curves, precision_strip

OPS = ["conv1", "layer1.0.conv1", "layer1.0.conv2", "fc"]


@pytest.fixture
def saved(monkeypatch):
    figs = []

    def save(self, path, *a, **k):
        figs.append(self)
        Path(path).write_bytes(b"")  # a file where the caller expects one

    monkeypatch.setattr(Figure, "savefig", save)
    return figs


def _plan(precisions: dict[str, dict[str, str]]) -> Plan:
    groups = {g: GroupPlan(device="T4", count=1, local_batch=8, precisions=p, compute_ms=1.0, comm_exposed_ms=0.0,
                           iteration_ms=1.0, peak_memory_bytes=1.0, memory_capacity_bytes=1e9, indicator=0.0)
              for g, p in precisions.items()}
    return Plan(job="job", model="m", objective="accuracy_degradation", groups=groups, iteration_ms=1.0, indicator=0.0,
                solver=SolverReport(backend="t", status="optimal", objective=0.0, wall_s=0.0),
                provenance=Provenance(spec_digest="t", versions={}))


def _texts(labels) -> list[str]:
    return [t.get_text() for t in labels]


def test_precision_strip_names_operators_titles_and_keeps_spec_order(saved, tmp_path):
    plan = _plan({"first": {o: "fp32" for o in OPS}, "second": {o: ("int8" if o != "fc" else "fp32") for o in OPS}})
    precision_strip(plan, tmp_path / "p.png")
    ax = saved[0].axes[0]
    assert _texts(ax.get_xticklabels()) == OPS
    assert "precision per operator" in ax.get_title(loc="left")
    rows = sorted(zip([t.get_position()[1] for t in ax.get_yticklabels()], _texts(ax.get_yticklabels())))
    top = rows[0] if ax.yaxis_inverted() else rows[-1]
    assert top[1].startswith("first")  # the spec's first group on top


def test_precision_strip_says_when_nothing_is_lowered(saved, tmp_path):
    precision_strip(_plan({"a": {o: "fp32" for o in OPS}}), tmp_path / "p.png")
    assert "nothing lowered" in saved[0].axes[0].get_title(loc="left")


def test_precision_strip_of_a_large_model_names_its_blocks(saved, tmp_path):
    ops = [f"encoder.layer.{i}.{m}" for i in range(12) for m in ("q", "k", "v", "o", "fc1", "fc2")]
    precision_strip(_plan({"a": {o: "fp32" for o in ops}}), tmp_path / "p.png")
    assert "encoder.layer.7" in _texts(saved[0].axes[0].get_xticklabels())


def test_curves_have_a_title_one_outside_legend_and_accuracy_on_0_100(saved, tmp_path):
    steps = [{"step": s, "loss": 2.3 - 0.001 * s} for s in range(1, 21)]
    evals = [{"step": 20, "test_loss": 2.29, "test_accuracy": 0.114, "test_samples": 1024}]
    curves(steps, evals, tmp_path / "c.png")
    fig = saved[0]
    legends = [a.get_legend() for a in fig.axes if a.get_legend() is not None]
    assert len(legends) == 1 and "test accuracy" in " ".join(_texts(legends[0].get_texts()))
    box = legends[0].get_bbox_to_anchor().transformed(fig.axes[0].transAxes.inverted())
    assert box.y1 <= 0  # below the axes: it hides no point
    acc = next(a for a in fig.axes if "accuracy" in a.get_ylabel())
    assert acc.get_ylim() == (0, 100)
    assert any(a.get_title(loc="left") for a in fig.axes)


def test_timeline_legend_lists_only_what_occurs_and_labels_the_end_line(saved, tmp_path, monkeypatch):
    from types import SimpleNamespace

    import qsync_opt.training.predictor.timeline_export as te

    events = [{"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 1000, "cat": "forward", "name": "f"},
              {"ph": "X", "pid": 1, "tid": 2, "ts": 500, "dur": 200, "cat": "allreduce", "name": "b"}]
    monkeypatch.setattr(te, "chrome_trace", lambda tl: {"traceEvents": events})  # a timeline without casts
    te.write_png(SimpleNamespace(groups={"g": None}, sync_iteration_ms=1.5), tmp_path / "t.png", "t")
    labels = _texts(saved[0].axes[0].get_legend().get_texts())
    assert "cast" not in labels and "forward" in labels and "allreduce" in labels
    assert any("iteration end" in x for x in labels)
