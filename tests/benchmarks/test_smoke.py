"""Every script in benchmarks/ runs end to end at its smallest setting, as a user runs it.

Each script is found by globbing benchmarks/*.py (so a new script is covered, or fails here until it is), run as
`python benchmarks/X.py --smoke --out TMP` in its own process (started beside the suite, tests/benchmarks/conftest.py), and
must exit 0 having written the files it
declares in WRITES under TMP (a CSV with a header and at least one row), while benchmarks/results/ and docs/img/
(the published figures) stay exactly as they were. This keeps the command behind every published figure working;
the figures themselves are each script's own business.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"

#: Modules the scripts import or start, never run on their own (names starting with `_` are helpers too).
HELPERS = {
    "results_table.py": "every rollout script's CSV writer",
    "gpu_check_parts.py": "gpu_check.py's measurements",
    "gpu_check_verdicts.py": "what gpu_check.py's steps must satisfy",
    "gpu_check_gpt2.py": "gpu_check.py's GPT-2 step",
    "gpu_check_breakdown.py": "gpu_check.py's breakdown step",
    "predictor_worker.py": "the worker process predictor.py starts",
    "accuracy_models.py": "accuracy.py's networks",
    "accuracy_policies.py": "accuracy.py's planned policies",
    "balance_memory.py": "balance.py's memory table",
    "serving_model.py": "the serving benchmarks' trained byte-level Llama and its serving spec",
}

#: What each script's --smoke writes under --out (a .csv must hold a header and at least one row).
WRITES = {
    "accuracy.py": ["accuracy.csv", "summary.csv", "policies.json"],
    "accuracy_int4.py": ["accuracy_int4.csv"],
    "accuracy_fp8_backward.py": ["accuracy_fp8_backward.csv"],
    "accuracy_slack.py": ["slack_maps.csv", "slack_ops.csv"],
    "accuracy_summary.py": ["accuracy_summary.csv"],
    "balance.py": ["balance.csv", "balance_planner.csv", "balance_memory.csv", "balance.png"],
    "balance_exact_gain.py": ["balance_exact_gain.csv"],
    "balance_scale.py": ["balance_scale.csv"],
    "calibration_heldout.py": ["heldout.json", "plan_datasheet.json"],
    "concurrency.py": ["concurrency.csv"],
    "cpu_int8_conv.py": ["cpu_int8_conv.csv"],
    "ddp_step_readings.py": ["ddp_step_readings.csv"],
    "emulated_hybrid.py": ["emulated_hybrid.csv"],
    "fit_calibration.py": ["calibration.yaml"],
    "gpu_linear_prices.py": ["gpu_linear_prices.csv"],
    "gpu_check.py": ["ratios.csv", "summary.md", "results.json"],
    "hf_models.py": ["hf_models.csv"],
    "kernel_speed.py": ["kernels_gemm.csv", "kernels_quantize.csv"],
    "mixing_additivity.py": ["mixing_additivity.csv"],
    "predictor.py": ["predictor.csv", "indicators.csv", "predictor_scatter.png"],
    "plan_import_cost.py": ["plan_import_cost.csv"],
    "predictor_cpu_tiny.py": ["cpu_tiny_predict_vs_train.csv"],
    "profile_speed.py": ["profile_speed.csv"],
    "report_pictures.py": ["cpu_tiny_precisions.png", "cpu_tiny_curves.png", "cpu_tiny_timeline.png",
                           "resnet50_timeline.png", "resnet50_precisions.png"],
    "rollout.py": ["rollout.csv", "rollout_rounds.csv", "rollout_repack.csv"],
    "rollout_bits.py": ["rollout_bits.csv"],
    "rollout_ceilings.py": ["rollout_ceilings.csv"],
    "rollout_plan_time.py": ["rollout_plan_time.csv"],
    "rollout_redeal.py": ["rollout_redeal.csv"],
    "rollout_resolution.py": ["rollout_resolution.csv"],
    "rollout_seeds.py": ["rollout_seeds.csv"],
    "rollout_sim_time.py": ["rollout_sim_time.csv"],
    "rollout_streaming.py": ["rollout_streaming.csv"],
    "serving.py": ["serving.csv"],
    "serving_real.py": ["serving_real.csv"],
    "serving_costs.py": ["serving_costs.csv", "serving_costs_plans.csv"],
    "serving_quality.py": ["serving_quality.csv", "serving_quality_spearman.csv"],
    "solve_memory.py": ["solve_memory.csv"],
    "solvers.py": ["solvers.csv", "solvers.png"],
}

#: Scripts another test already runs with --smoke as a subprocess (and checks more closely): not run twice.
RUN_ELSEWHERE = {"gpu_check.py": "tests/kernels/test_gpu_check.py"}

#: Scripts whose --out defaults to published figures (or that read them by default), so --smoke requires --out.
PUBLISHED_DEFAULT_OUT = {"accuracy_summary.py", "fit_calibration.py", "kernel_speed.py", "predictor.py", "predictor_cpu_tiny.py",
                         "report_pictures.py", "serving.py", "solvers.py"}

def scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS and not p.name.startswith("_"))


def test_every_helper_is_used_by_a_script():
    """The helper list hides nothing: each is imported or started by another file in benchmarks/."""
    texts = {p.name: p.read_text() for p in BENCH.glob("*.py")}
    unused = [h for h in HELPERS
              if not any(re.search(rf"\b{Path(h).stem}\b", t) for name, t in texts.items() if name != h)]
    assert not unused, f"not imported by any benchmark script, so not helpers: {unused}"


@pytest.mark.parametrize("script", scripts())
def test_every_script_declares_its_smoke_outputs(script):
    assert script in WRITES, (f"benchmarks/{script}: give it a --smoke setting (smallest end-to-end run, writes only "
                              f"to --out) and list the files it writes in WRITES here")


@pytest.mark.slow
@pytest.mark.parametrize("script", scripts())
def test_script_runs_at_its_smoke_setting(script, smoke_runs, record_property):
    if script in RUN_ELSEWHERE:
        other = ROOT / RUN_ELSEWHERE[script]
        text = other.read_text()
        assert script in text and '"--smoke"' in text, f"{other} no longer runs {script} --smoke: run it here"
        pytest.skip(f"run at its smoke setting by {RUN_ELSEWHERE[script]}")
    p, out, wall_s = smoke_runs.result(script)
    record_property("script_wall_s", round(wall_s, 1))  # its own run (the test's duration includes waiting for it)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    for name in WRITES.get(script, []):
        path = out / name
        assert path.is_file() and path.stat().st_size > 0, f"{script} --smoke did not write {name}: {p.stdout[-2000:]}"
        if path.suffix == ".csv":
            rows = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
            assert len(rows) >= 2, f"{name} has no data row:\n{path.read_text()[:2000]}"
    changed = smoke_runs.changed_figures()
    assert not changed, f"a smoke run changed published figures: {changed}"


def test_smoke_without_out_is_refused_where_out_defaults_to_published_figures():
    """A script whose --out defaults into benchmarks/results or docs/img refuses --smoke without --out (exit 2,
    naming the flag), so a smoke run can never overwrite a published figure."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(script):
        return subprocess.run([sys.executable, str(BENCH / script), "--smoke"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)

    with ThreadPoolExecutor(2) as pool:
        got = dict(zip(sorted(PUBLISHED_DEFAULT_OUT), pool.map(run, sorted(PUBLISHED_DEFAULT_OUT))))
    wrong = {s: (p.returncode, p.stderr[-500:]) for s, p in got.items()
             if p.returncode != 2 or "--smoke needs --out" not in p.stderr}
    assert not wrong, wrong
