"""benchmarks/gpu_check.py's CPU path, as CI runs it (its --smoke setting, which tests/benchmarks/test_smoke.py leaves
to this test): every step executes on CPU tensors and writes its files, and what needs a GPU is said to be skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_its_cpu_path(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path), "--smoke"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "--smoke given: running the CPU-side checks" in p.stdout
    assert "skipped (they need a GPU): step 2 (build the templated CUDA extension), step 3 (the CUDA tests" in p.stdout
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["gpu"] is False
    assert [(s[0], s[1]) for s in res["steps"]] == [(n, "ok") for n in
                                                    ("imports", "dispatch", "ratios", "breakdown", "gemm_choices",
                                                     "gpt2", "profile", "train", "libraries")]
    assert "qsync_opt.kernels.dispatch" in res["imports"]
    # every precision measured on both shapes, each with its error against float64
    rows = res["ratios"]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check_verdicts import REL_ERR_TOLERANCE

    assert len(rows) == 20 and all("fwd_bwd_ms" in r and "grad_rel_err_vs_fp64" in r for r in rows)
    assert [(r["precision"], r["backward"]) for r in rows[8:10]] == [("fp8_e4m3", "fp8"), ("fp8_e5m2", "fp8")]
    assert "; backward " in rows[8]["implementation"] and "; backward " not in rows[18]["implementation"]  # conv
    assert {(r["shape"], r["precision"]) for r in rows if r["rel_err_vs_fp64"] > REL_ERR_TOLERANCE[r["precision"]]} == set()
    assert {r["rel_err_vs_fp64"] < 1e-6 for r in rows if r["precision"] == "fp32"} == {True}
    # each lower precision really is lower: its error is above fp32's (a format that silently ran fp32 shows ~1e-7)
    assert all(r["rel_err_vs_fp64"] > 1e-5 for r in rows if r["precision"] not in ("fp32", "tf32"))
    # the linear as a user could run it instead: bf16, the runtime's fp8 module, torchao's two float8 recipes
    # (eager on CPU; torch.compile rows only on a GPU), each within its precision's error bound
    libs = res["libraries"]
    assert [(r["implementation"], r["compiled"]) for r in libs] == [
        ("torch bf16 module", False), ("qsync runtime module", False), ("qsync runtime module, fp8 backward", False),
        ("torchao Float8Linear tensorwise", False), ("torchao Float8Linear rowwise", False)]
    for r in libs:
        if "torchao is not installed" in r.get("error", ""):
            continue
        assert r["rel_err_vs_fp64"] <= REL_ERR_TOLERANCE[r["precision"]] and r["fwd_bwd_ms"] > 0, r
        assert r["rel_err_vs_fp64"] > 1e-4, r  # a lower precision really ran (fp32 would give ~1e-7)
    # where the time goes, per runtime step: each configuration's ranges and what is outside them make its total
    bd = res["breakdown"]
    for config in ("bf16, backward -", "fp8_e4m3, backward bf16", "fp8_e4m3, backward fp8", "int8, backward bf16"):
        mine = [r for r in bd if r["config"] == config]
        total = next(r["ms"] for r in mine if r["kind"] == "total")
        assert total > 0 and abs(sum(r["ms"] for r in mine if r["kind"] in ("range", "outside")) - total) < 1e-6 * total
    names = {r["name"] for r in bd if r["config"] == "fp8_e4m3, backward fp8" and r["kind"] == "range"}
    assert {"quantize[fp8_e4m3]", "backward[fp8_e4m3@fp8]", "quantize[grad->fp8_e5m2]"} <= names, names
    # one GEMM alone: the float baselines beside the low-precision ones, torch._scaled_mm's variants recorded
    gc = {r["gemm"].split()[0]: r for r in res["gemm_choices"]}
    assert {"fp32", "tf32", "bf16", "int8", "int4", "fp8_e4m3", "fp8_e5m2"} <= set(gc)
    assert gc["bf16"]["torch_rel_err"] > 1e-4 > gc["fp32"]["torch_rel_err"]  # bf16 really rounded, fp32 did not
    assert {"fast_accum_ms", "bf16_out_ms"} <= set(gc["fp8_e4m3"]) or "fast_accum_error" in gc["fp8_e4m3"]
    # the templated and torch GEMMs agree bit for bit on CPU
    assert all(r.get("bit_exact") or "not exact on this CPU" in r.get("note", "") for r in res["gemm_choices"]
               if r["gemm"].startswith("int"))
    prof = json.loads((tmp_path / "profile.json").read_text())
    assert prof["ops"] and all(set(s["fwd_ms"]) == {"fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8",
                                                      "int4"} for s in prof["signatures"].values())
    # GPT-2 as a user runs it: profiled by `qsync-opt profile`, planned and trained by `qsync-opt run` on measured
    # costs, the same plan priced by the (calibrated) roofline, each prediction beside the measured iteration
    g = res["gpt2"]
    assert g["model"] == "tiny-gpt2" and g["device"] == "cpu-local"
    assert set(g["costs"].values()) and all(c.startswith("measured") for c in g["costs"].values()), g["costs"]
    assert all(c.startswith("roofline") for c in g["calibrated_costs"].values()), g["calibrated_costs"]
    assert g["profile_s"] > 0 and g["measured_ms"] > 0 and g["measured_steps"] == 2
    assert g["predicted_measured_costs_ms"] > 0 and g["predicted_calibrated_ms"] > 0
    assert g["measured_costs_err"] == round(abs(g["predicted_measured_costs_ms"] / g["measured_ms"] - 1), 3)
    assert (tmp_path / "gpt2_run" / "report.md").exists()
    assert res["train"]["finite"] and len(res["train"]["losses"]) == 2
    assert len(set(res["train"]["precisions"])) >= 4  # a mixed plan
    for f in ("summary.md", "ratios.csv", "breakdown.csv", "gemm_choices.csv", "dispatch.txt"):
        assert (tmp_path / f).stat().st_size > 0
    assert "int4       templated: qsync.cuda.int4_wmma" in (tmp_path / "dispatch.txt").read_text()
    summary = (tmp_path / "summary.md").read_text()
    assert "Skipped (they need a GPU): step 2" in summary
    if not torch.cuda.is_available():
        assert "CPU (no CUDA device)" in summary


def test_the_shape_hooks_leave_the_models_output_alone():
    """gpu_check's profile step failed on the H200 ('tuple' object has no attribute 'dim'): its forward hooks
    returned the recorded shape, which replaced each hooked module's output."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check_parts import input_shapes

    from qsync_opt.models.zoo import get_entry

    entry = get_entry("tiny-resnet")  # convolutions feeding batch norms, as resnet18 on the GPU
    model = entry.build().eval()
    (x,) = entry.example_inputs(2, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(x)
    shapes = input_shapes(model, (x,))
    with torch.no_grad():
        assert torch.equal(model(x), before)  # and the hooks are gone
    assert shapes["conv1"] == tuple(x.shape) and len(shapes) >= 10


def test_the_gpt2_steps_processes_keep_the_callers_pythonpath(monkeypatch, tmp_path):
    """On a lent GPU the dependencies live in a folder on PYTHONPATH (../shared/gpu/prepare-device.sh): the
    `qsync-opt` processes of step 6 must see it after this tree, or they cannot import pydantic."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check_gpt2 import child_env

    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    env = child_env(tmp_path / "p")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/tmp/site"]
    assert env["QSYNC_OPT_PROFILE_DIR"] == str(tmp_path / "p")
    monkeypatch.delenv("PYTHONPATH")
    assert child_env(tmp_path / "p")["PYTHONPATH"] == str(ROOT)


def test_an_fp8_gradient_beyond_e5m2s_tolerance_is_a_failed_ratio():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check_verdicts import REL_ERR_TOLERANCE, ratio_problems

    row = {"shape": "linear", "precision": "fp8_e4m3", "backward": "fp8", "fwd_bwd_ms": 1.0, "rel_err_vs_fp64": 0.03}
    assert ratio_problems([{**row, "grad_rel_err_vs_fp64": 0.06}]) == []  # e5m2 rounding: ~6e-2
    bad = ratio_problems([{**row, "grad_rel_err_vs_fp64": 0.9}])  # e.g. a transposed operand
    assert bad == [f"linear fp8_e4m3 (fp8 backward): input gradient relative error 0.9 vs float64 above its "
                   f"tolerance {REL_ERR_TOLERANCE['fp8_e5m2']:g}"]
    # the same gradient error under a bf16 backward is held to fp8_e4m3's own tolerance
    assert ratio_problems([{**row, "backward": "bf16", "grad_rel_err_vs_fp64": 0.1}])


def test_the_speed_targets_line_takes_the_best_fp8_row_of_either_backward():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check_verdicts import speed_targets

    rows = [{"shape": "linear 8192x4096->4096", "precision": "fp8_e4m3", "backward": "bf16", "speedup_vs_bf16": 0.63},
            {"shape": "linear 8192x4096->4096", "precision": "fp8_e4m3", "backward": "fp8", "speedup_vs_bf16": 1.41},
            {"shape": "linear 8192x4096->4096", "precision": "int8", "backward": "bf16", "speedup_vs_bf16": 0.59},
            {"shape": "conv3x3 b64 256->256 28x28", "precision": "int8", "backward": "bf16", "speedup_vs_bf16": 2.0}]
    line = speed_targets(rows)
    assert "fp8: best 1.41x bf16 (fp8_e4m3, backward fp8; target 1.3x): met" in line
    assert "int8: best 0.59x bf16 (int8, backward bf16; target 1.15x): not met" in line  # the conv row is not the target
    assert "fp8: not measured" in speed_targets(rows[2:])
