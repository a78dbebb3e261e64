"""benchmarks/gpu_check.py's verdicts mean something: a step whose numbers are wrong fails, and so does
a CUDA test run that ran nothing. All CPU-runnable: the steps' results are given, not measured."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # puts benchmarks/ on sys.path for gpu_check_parts
    return mod


def verdict(gpu_check, tmp_path, name, result):
    run = gpu_check.Run(tmp_path, budget_s=60)
    run.step(name, lambda: result)
    (step,) = run.steps
    return step[1], step[3]


GOOD_RATIOS = [{"shape": "linear", "precision": "int8", "implementation": "x", "fwd_bwd_ms": 1.0, "rel_err_vs_fp64": 0.01},
               {"shape": "linear", "precision": "fp32", "implementation": "x", "fwd_bwd_ms": 2.0, "rel_err_vs_fp64": 1e-7}]


def test_right_numbers_pass(gpu_check, tmp_path):
    assert verdict(gpu_check, tmp_path, "ratios", GOOD_RATIOS)[0] == "ok"
    assert verdict(gpu_check, tmp_path, "gemm_choices", [{"gemm": "int8 8x8x8", "bit_exact": True},
                                                         {"gemm": "fp8_e4m3 8x8x8", "auto_rel_err": 1e-8,
                                                          "templated_rel_err": 1e-8}])[0] == "ok"
    assert verdict(gpu_check, tmp_path, "train", {"steps": 2, "losses": [2.3, 2.2]})[0] == "ok"


def test_integer_gemm_that_is_not_bit_exact_fails(gpu_check, tmp_path):
    status, note = verdict(gpu_check, tmp_path, "gemm_choices", [{"gemm": "int8 64x96x80", "bit_exact": False}])
    assert status == "FAILED" and "bit_exact" in note
    status, _ = verdict(gpu_check, tmp_path, "gemm_choices",
                        [{"gemm": "int8 64x96x80", "bit_exact": True, "triton_bit_exact": False}])
    assert status == "FAILED"


def test_non_finite_loss_fails(gpu_check, tmp_path):
    status, note = verdict(gpu_check, tmp_path, "train", {"steps": 3, "losses": [2.3, float("nan"), float("inf")]})
    assert status == "FAILED" and "non-finite loss" in note
    assert (tmp_path / "error_train.txt").exists()


@pytest.mark.parametrize("precision, err", [("int8", 0.2), ("fp32", 1e-3), ("bf16", 0.05), ("int4", 0.45),
                                            ("fp16", float("nan"))])
def test_relative_error_beyond_its_precisions_tolerance_fails(gpu_check, tmp_path, precision, err):
    rows = [*GOOD_RATIOS, {"shape": "conv", "precision": precision, "implementation": "x", "fwd_bwd_ms": 1.0,
                           "rel_err_vs_fp64": err}]
    status, note = verdict(gpu_check, tmp_path, "ratios", rows)
    assert status == "FAILED" and f"conv {precision}" in note


def test_each_precision_has_a_tolerance_tighter_than_the_old_blanket_half(gpu_check):
    import gpu_check_verdicts as verdicts

    from qsync_opt.precision import PRECISIONS

    assert set(verdicts.REL_ERR_TOLERANCE) == set(PRECISIONS)
    assert all(t < 0.5 for t in verdicts.REL_ERR_TOLERANCE.values())
    assert verdicts.REL_ERR_TOLERANCE["fp32"] <= 1e-5 and verdicts.REL_ERR_TOLERANCE["int8"] <= 0.05


@pytest.mark.parametrize("code, ok", [(0, True), (5, False), (1, False)])
def test_pytest_exit_5_no_tests_ran_is_a_failure(gpu_check, tmp_path, monkeypatch, code, ok):
    def fake_run(cmd, **kw):
        return subprocess.CompletedProcess(cmd, code, stdout="no tests ran in 0.01s\n" if code == 5 else "1 passed\n",
                                           stderr="")

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    run = gpu_check.Run(tmp_path, budget_s=60)
    run.step("cuda_tests", lambda: gpu_check.cuda_tests(tmp_path, 10))
    assert (run.steps[0][1] == "ok") == ok, run.steps
    if code == 5:
        assert "no tests" in run.steps[0][3]


def test_fp8_gemm_is_judged_by_its_implementations_accumulation_bound(gpu_check, tmp_path):
    """The H200's torch._scaled_mm showed 1.28e-4 at K = 4096 (its tensor cores accumulate in about 14 bits):
    within the library bound sqrt(K)·2^-14, outside the templated kernels' fp32-accumulation bound."""
    row = {"gemm": "fp8_e4m3 8192x4096x4096", "auto_rel_err": 1.28e-4, "templated_rel_err": 2e-7}
    assert verdict(gpu_check, tmp_path, "gemm_choices", [row])[0] == "ok"
    status, note = verdict(gpu_check, tmp_path, "gemm_choices", [{**row, "templated_rel_err": 1.28e-4}])
    assert status == "FAILED" and "templated" in note
    status, _ = verdict(gpu_check, tmp_path, "gemm_choices", [{**row, "auto_rel_err": 2e-2}])  # a wrong scale or operand
    assert status == "FAILED"


def test_float_baseline_gemms_are_judged_by_their_precisions_tolerance(gpu_check, tmp_path):
    """fp32/tf32/bf16 rows of one GEMM are the baselines the low-precision GEMMs are read against: a bf16 GEMM off by
    more than bf16's tolerance, or an fp32 one that ran in TF32 (~5e-4), fails the step."""
    rows = [{"gemm": "fp32 8x8x8", "torch_rel_err": 2e-7, "torch_ms": 0.1},
            {"gemm": "tf32 8x8x8", "torch_rel_err": 5e-4, "torch_ms": 0.1},
            {"gemm": "bf16 8x8x8", "torch_rel_err": 2e-3, "torch_ms": 0.1}]
    assert verdict(gpu_check, tmp_path, "gemm_choices", rows)[0] == "ok"
    status, note = verdict(gpu_check, tmp_path, "gemm_choices", [{**rows[0], "torch_rel_err": 5e-4}])
    assert status == "FAILED" and "fp32 8x8x8" in note
    status, _ = verdict(gpu_check, tmp_path, "gemm_choices", [{**rows[2], "torch_ms": float("nan")}])
    assert status == "FAILED"


def test_breakdown_needs_every_configuration_and_its_gemm(gpu_check, tmp_path):
    import gpu_check_breakdown as breakdown

    def rows(config, gemm):
        return [{"config": config, "kind": "total", "name": "all", "ms": 1.0, "share": 1.0},
                {"config": config, "kind": "range", "name": gemm, "ms": 0.6, "share": 0.6},
                {"config": config, "kind": "outside", "name": "outside", "ms": 0.4, "share": 0.4}]

    good = (rows("bf16, backward -", "cast[fp32->bf16]") + rows("fp8_e4m3, backward bf16", "gemm[fp8_e4m3]")
            + rows("fp8_e4m3, backward fp8", "gemm[fp8_e4m3]") + rows("int8, backward bf16", "gemm[int8]"))
    assert verdict(gpu_check, tmp_path, "breakdown", good)[0] == "ok"
    status, note = verdict(gpu_check, tmp_path, "breakdown", good[:9])  # int8 missing
    assert status == "FAILED" and "int8" in note
    renamed = [{**r, "name": "gemm"} if r["name"] == "gemm[int8]" else r for r in good]
    status, note = verdict(gpu_check, tmp_path, "breakdown", renamed)
    assert status == "FAILED" and "no gemm[int8] range" in note
    negative = [{**r, "ms": -0.2} if r["name"] == "gemm[fp8_e4m3]" else r for r in good]
    assert verdict(gpu_check, tmp_path, "breakdown", negative)[0] == "FAILED"
    assert len(breakdown.table(good)) == 2 + 4
