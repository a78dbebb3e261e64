"""`indicator.method: auto` (the default): empirical on fp32-warmed-up weights with data, else weight.

What a user relies on: without data the plan says its ω came from random weights; with data,
`indicate` (and `run`) compute the empirical indicator once and cache it by model, data and
warm-up steps, `solve` uses that cache, and when it is missing `solve` says which indicator it
fell back to and how to get the better one; the plan always records which indicator it used.
"""

from __future__ import annotations

import json

import pytest

from qsync_opt.training.predictor.indicator_auto import resolved_method
from qsync_opt.training.predictor.indicators import compute_indicator
from qsync_opt.training.spec import load_spec

SPEC = """
cluster:
  groups: [{name: cpu, device: cpu-local}]
model: {name: tiny-cnn}
training: {global_batch: 8, optimizer: sgd, lr: 0.1}
indicator: {calibration: {batches: 1, batch_size: 4}%s}
"""
DATA = "data: {name: mnist1d, input_shape: [1, 40]}\n"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path))
    return tmp_path / "indicators"


def test_auto_is_the_default_and_without_data_is_the_weight_indicator_on_random_weights():
    spec = load_spec(SPEC % "")
    assert spec.indicator.method == "auto" and resolved_method(spec) == "weight"
    sens, note = compute_indicator(spec)
    assert "weight on random initial weights" in note and "no data" in note
    weight, _ = compute_indicator(load_spec(SPEC % ", method: weight"))
    assert sens.omega == weight.omega


def test_solve_without_the_cache_falls_back_to_weight_and_says_how_to_get_empirical(cache):
    spec = load_spec(SPEC % ", warmup_steps: 3" + DATA)
    assert resolved_method(spec) == "empirical"
    sens, note = compute_indicator(spec, compute=False)
    assert "fell back" in note and "qsync-opt indicate" in note and "empirical" in note
    weight, _ = compute_indicator(load_spec(SPEC % ", method: weight" + DATA))
    assert sens.omega == weight.omega
    assert not cache.exists() or not list(cache.glob("auto-empirical-*.json"))  # nothing trained, nothing cached


@pytest.mark.slow  # two warm-ups and two empirical indicators on MNIST-1D: ~15 s on a loaded 2-core machine
def test_indicate_computes_empirical_on_warmed_up_weights_once_and_solve_reads_it(cache):
    spec = load_spec(SPEC % ", warmup_steps: 3" + DATA)
    sens, note = compute_indicator(spec)
    assert sens.method == "empirical" and "weights trained 3 fp32 steps" in note
    files = list(cache.glob("auto-empirical-*.json"))
    assert len(files) == 1
    again, note2 = compute_indicator(spec, compute=False)  # what solve does
    assert again.omega == sens.omega and f"cached {files[0]}" in note2
    # the warm-up keys the cache and changes the weights ω is measured on
    other, _ = compute_indicator(load_spec(SPEC % ", warmup_steps: 6" + DATA))
    assert len(list(cache.glob("auto-empirical-*.json"))) == 2 and other.omega != sens.omega


def test_no_warm_up_is_the_empirical_indicator_on_the_same_weights_and_data():
    auto, _ = compute_indicator(load_spec(SPEC % ", warmup_steps: 0" + DATA))
    empirical, _ = compute_indicator(load_spec(SPEC % ", method: empirical" + DATA))
    assert auto.omega.keys() == empirical.omega.keys()
    for op, w in auto.omega.items():
        assert w == pytest.approx(empirical.omega[op], rel=1e-9, abs=1e-15), op


def test_cli_indicate_fills_the_cache_solve_uses_and_the_plan_records_it(tmp_path, cache, capsys):
    from qsync_opt.cli.commands import main

    path = tmp_path / "job.yaml"
    path.write_text(SPEC % ", warmup_steps: 2" + DATA)
    out = tmp_path / "plan.json"
    assert main(["solve", str(path), "-o", str(out)]) == 0
    before = json.loads(out.read_text())["indicator_used"]
    assert before.startswith("indicator: weight") and "fell back" in before
    assert main(["indicate", str(path)]) == 0
    assert len(list(cache.glob("auto-empirical-*.json"))) == 1
    assert main(["solve", str(path), "-o", str(out)]) == 0
    after = json.loads(out.read_text())["indicator_used"]
    assert after.startswith("indicator: empirical on weights trained 2 fp32 steps") and "cached" in after
