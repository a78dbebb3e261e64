"""The calibration: fitted from the committed GPU runs, applied by architecture and implementation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from qsync_opt.hardware import calibration
from qsync_opt.hardware.calibration import CalibrationError
from qsync_opt.hardware.calibration_fit import fit_files, record_device, render, shape_flops
from qsync_opt.hardware.device import find_device
from qsync_opt.models.graph import OpNode
from qsync_opt.training.predictor.costs import selectable_cost

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "gpu"
H200_RUN = RESULTS / "h200-gpu-check-results.json"
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_calibration  # noqa: E402


def test_the_package_file_is_the_fit_of_the_committed_results(tmp_path):
    """calibration.yaml cannot drift from its source: refitting every committed run gives its exact bytes."""
    package = (ROOT / "qsync_opt" / "hardware" / "calibration.yaml").read_text()
    text, skipped, n = fit_calibration.fitted_text(RESULTS)
    assert n >= 1 and text == package, "run `python benchmarks/fit_calibration.py` and commit calibration.yaml"
    assert fit_calibration.main(["--smoke", "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "calibration.yaml").read_text() == package
    assert fit_calibration.main(["--check"]) == 0


def test_smoke_needs_an_out_file():
    assert fit_calibration.main(["--smoke"]) == 2


def test_a_factor_is_three_forward_gemms_over_the_measured_time_over_the_peak():
    rows = {(r["shape"], r["precision"]): r["fwd_bwd_ms"] for r in json.loads(H200_RUN.read_text())["ratios"]}
    h200 = find_device("H200")
    bf16 = h200.calibration("bf16", "linear")
    flops = 2 * 8192 * 4096 * 4096
    expect = 3 * flops / (rows[("linear 8192x4096->4096", "bf16")] / 1e3) / (989e12)
    assert bf16.factor == pytest.approx(expect, rel=1e-3) and bf16.rate == "bf16"
    assert bf16.sources[0].file == "benchmarks/results/gpu/h200-gpu-check-results.json"
    assert bf16.sources[0].device == "H200" and bf16.sources[0].shape == "linear 8192x4096->4096"
    # int8 priced at the int8 peak: below bf16's achieved rate, as measured
    assert h200.achieved_flops("int8", "linear") < h200.achieved_flops("bf16", "linear")
    assert h200.achieved_flops("fp8_e4m3", "linear") < h200.achieved_flops("bf16", "linear")
    # ops of no calibrated kind keep the catalog's judgement
    assert h200.achieved_flops("bf16") == pytest.approx(989e12 * h200.efficiency["bf16"])


@pytest.mark.parametrize("label,kind", [("linear 8192x4096->4096", "linear"), ("conv3x3 b64 256->256 28x28", "conv")])
def test_the_calibrated_roofline_gives_back_the_measured_module_times(label, kind):
    """On the shapes it was fitted on, an op costs what the runtime module measured (launches aside)."""
    measured = {r["precision"]: r["fwd_bwd_ms"] for r in json.loads(H200_RUN.read_text())["ratios"] if r["shape"] == label}
    h200 = find_device("H200")
    if kind == "linear":
        m, k, n = 8192, 4096, 4096
        node = OpNode("l", "linear", True, ((m, k),), (m, n), 2 * m * k * n, 4 * m * k * n, k * n, 0, 0, (n, k))
    else:
        b, c, hw = 64, 256, 28
        f = 2 * b * c * hw * hw * c * 9
        node = OpNode("c", "conv2d", True, ((b, c, hw, hw),), (b, c, hw, hw), f, 2 * f, c * c * 9, 0, 0, (c, c, 3, 3))
    assert shape_flops(label) == (kind, node.fwd_flops)
    for p in h200.precisions:
        cost = selectable_cost(node, p, h200, "bf16", boundary="fp32")
        assert cost.total_ms == pytest.approx(measured[p], rel=0.02), p
        assert cost.weight_cast_ms == 0  # inside the measured module


def test_a_factor_applies_to_its_architecture_and_implementation_only():
    h100, a100 = find_device("H100-SXM"), find_device("A100-80GB")
    assert h100.calibration("bf16", "linear") is not None  # sm_90, as the H200 measured
    assert h100.calibration("bf16", "conv") is not None
    assert a100.calibration("bf16", "linear") is None  # sm_80: never measured
    assert h100.calibration("bf16", None) is None  # embeddings, norms: no calibrated kind
    templated = h100.with_kernels("templated")  # fp8_e4m3 then runs the templated kernel, not torch._scaled_mm
    assert templated.calibration("fp8_e4m3", "linear") is None
    assert templated.calibration("bf16", "linear") is not None
    assert calibration.op_kind("bmm") == "linear" and calibration.op_kind("conv1d") == "conv"
    assert calibration.op_kind("embedding") is None


def test_a_results_file_names_its_device(tmp_path):
    rec = json.loads(H200_RUN.read_text())
    assert record_device(rec, H200_RUN).name == "H200"
    named = tmp_path / "run1-gpu-check-results.json"
    assert record_device({**rec, "device": "NVIDIA H100 80GB HBM3"}, named).name == "H100-SXM"
    with pytest.raises(CalibrationError, match="cannot tell the device"):
        record_device(rec, named)
    with pytest.raises(CalibrationError, match="sm_80"):
        record_device({**rec, "dispatch": {"target": "sm_90"}}, tmp_path / "a100-80gb-gpu-check-results.json")


def test_unknown_shapes_and_failed_rows(tmp_path):
    rec = json.loads(H200_RUN.read_text())
    bad = tmp_path / "h200-gpu-check-results.json"
    bad.write_text(json.dumps({**rec, "ratios": [{"shape": "attention 8x512", "precision": "bf16", "fwd_bwd_ms": 1.0,
                                                    "implementation": "library: torch.matmul"}]}))
    with pytest.raises(CalibrationError, match="attention 8x512"):
        fit_files([bad], tmp_path)
    bad.write_text(json.dumps({**rec, "ratios": [{"shape": "linear 64x64->64", "precision": "int8", "error": "boom"}],
                               "gemm_choices": []}))
    factors, skipped = fit_files([bad], tmp_path)
    assert factors == () and "boom" in skipped[0]
    assert render(factors).endswith("factors: []\n")


def test_a_module_measured_with_an_fp8_backward_fits_a_factor_of_its_own(tmp_path, monkeypatch):
    """The next GPU run's `backward: fp8` rows: the linear's fits a factor that prices only fp8 linears run that way
    (and gives their measured time back), beside the 16-bit-backward factor; a conv row under fp8 backward ran its
    16-bit backward and joins that one; the rendering reads back as it was fitted."""
    lin, conv = "linear 8192x4096->4096", "conv3x3 b64 256->256 28x28"
    lib = "library: torch._scaled_mm"
    rows = [{"shape": lin, "precision": "fp8_e4m3", "backward": "bf16", "implementation": lib, "fwd_bwd_ms": 2.6},
            {"shape": lin, "precision": "fp8_e4m3", "backward": "fp8",
             "implementation": f"{lib}; backward {lib}; forward use_fast_accum",  # gpu_check labels it so on sm_90
             "fwd_bwd_ms": 1.2},
            {"shape": conv, "precision": "fp8_e4m3", "backward": "bf16", "implementation": lib, "fwd_bwd_ms": 3.2},
            {"shape": conv, "precision": "fp8_e4m3", "backward": "fp8", "implementation": lib, "fwd_bwd_ms": 3.4}]
    path = tmp_path / "h100-sxm-gpu-check-results.json"
    path.write_text(json.dumps({"ratios": rows}))
    fs, skipped = fit_files([path], tmp_path)
    assert skipped == []
    by = {(f.op, f.backward): f for f in fs}
    assert set(by) == {("linear", None), ("linear", "fp8"), ("conv", None)} and len(by[("conv", None)].sources) == 2
    assert calibration.parse(render(fs)) == fs and "backward: fp8" in render(fs)
    monkeypatch.setattr(calibration, "factors", lambda: fs)
    h100 = find_device("H100-SXM")
    m, k, n = 8192, 4096, 4096
    node = OpNode("l", "linear", True, ((m, k),), (m, n), 2 * m * k * n, 4 * m * k * n, k * n, 0, 0, (n, k))
    assert selectable_cost(node, "fp8_e4m3", h100, "fp8", boundary="fp32").total_ms == pytest.approx(1.2, rel=0.02)
    assert selectable_cost(node, "fp8_e4m3", h100, "bf16", boundary="fp32").total_ms == pytest.approx(2.6, rel=0.02)
    assert h100.calibration("fp8_e4m3", "linear", "fp8").factor > h100.calibration("fp8_e4m3", "linear").factor
    assert "(backward fp8)" in h100.calibration("fp8_e4m3", "linear", "fp8").describe()


def test_a_gemm_timed_alone_fits_a_gemm_factor_of_its_implementation():
    """gemm_choices' rows: 2·M·K·N over the GEMM's time over its rate's peak, per implementation the device's dispatch
    names; a mixed-format GEMM of the same implementation takes the one measured at another format."""
    from qsync_opt.kernels.dispatch import Target, fp8_backward_impl, gemm_impl

    h100 = find_device("H100-SXM")
    choices = {r["gemm"]: r for r in json.loads(H200_RUN.read_text())["gemm_choices"]}
    flops = 2 * 8192 * 4096 * 4096
    lib = calibration.gemm_factor(h100, "fp8_e4m3", gemm_impl(Target("cuda", 90), "fp8_e4m3", "auto"))
    assert lib.op == "gemm" and lib.implementation == "library: torch._scaled_mm"
    assert lib.factor == pytest.approx(flops / (choices["fp8_e4m3 8192x4096x4096"]["auto_ms"] / 1e3) / 1979e12, rel=1e-3)
    tpl = calibration.gemm_factor(h100, "int8", gemm_impl(Target("cuda", 90), "int8", "templated"))
    assert tpl.factor == pytest.approx(flops / (choices["int8 8192x4096x4096"]["templated_ms"] / 1e3) / 1979e12,
                                       rel=1e-3)
    mixed = fp8_backward_impl(Target("cuda", 90), "fp8_e4m3")  # e5m2 x e4m3 through torch._scaled_mm
    assert calibration.gemm_factor(h100, "fp8_e5m2", mixed) is lib
    assert calibration.gemm_factor(find_device("A100-80GB"), "int8", gemm_impl(Target("cuda", 80), "int8")) is None


def test_fp8_trainings_fast_accumulating_forward_gemm_is_calibrated_apart(tmp_path, monkeypatch):
    """gemm_choices' fast_accum_ms fits a factor of torch._scaled_mm with use_fast_accum, which prices the forward GEMM
    of fp8 linears under backward_precision 'fp8' (what the runtime runs there) and nothing else; unmeasured, that
    GEMM takes torch._scaled_mm's own factor. The float baselines fit GEMM factors of torch.matmul per format."""
    from qsync_opt.kernels.dispatch import SCALED_MM_FAST, Target, fp8_training_forward_impl, gemm_impl
    from qsync_opt.training.predictor.costs import forward_gemm_impl

    h100 = find_device("H100-SXM")
    fast = fp8_training_forward_impl(Target("cuda", 90), "fp8_e4m3")
    assert fast.op == SCALED_MM_FAST and forward_gemm_impl("linear", "fp8_e4m3", h100, "fp8") == fast
    assert forward_gemm_impl("linear", "fp8_e4m3", h100, "bf16").op == "torch._scaled_mm"
    assert forward_gemm_impl("conv2d", "fp8_e4m3", h100, "fp8").op == "torch._scaled_mm"  # convs keep 16-bit grads
    plain = calibration.gemm_factor(h100, "fp8_e4m3", gemm_impl(Target("cuda", 90), "fp8_e4m3"))
    assert calibration.gemm_factor(h100, "fp8_e4m3", fast) is plain  # not measured yet: the plain GEMM's factor
    flops = 2 * 8192 * 4096 * 4096
    row = {"gemm": "fp8_e4m3 8192x4096x4096", "auto_ms": 0.55, "fast_accum_ms": 0.35, "bf16_out_ms": 0.5}
    path = tmp_path / "h100-sxm-gpu-check-results.json"
    path.write_text(json.dumps({"ratios": [], "gemm_choices": [row, {"gemm": "bf16 8192x4096x4096", "torch_ms": 0.6}]}))
    fs, skipped = fit_files([path], tmp_path)
    by = {(f.precision, f.implementation): f.factor for f in fs}
    assert by == {("bf16", "library: torch.matmul"): pytest.approx(flops / 0.6e-3 / 989e12, rel=1e-3),
                  ("fp8_e4m3", "library: torch._scaled_mm"): pytest.approx(flops / 0.55e-3 / 1979e12, rel=1e-3),
                  ("fp8_e4m3", fast.label): pytest.approx(flops / 0.35e-3 / 1979e12, rel=1e-3)}, (by, skipped)
    monkeypatch.setattr(calibration, "factors", lambda: fs)
    assert calibration.gemm_factor(h100, "fp8_e4m3", fast).factor == by[("fp8_e4m3", fast.label)]
    assert calibration.gemm_factor(h100, "fp8_e4m3", gemm_impl(Target("cuda", 90), "fp8_e4m3")).factor == \
        by[("fp8_e4m3", "library: torch._scaled_mm")]
    m, k, n = 8192, 4096, 4096
    node = OpNode("l", "linear", True, ((m, k),), (m, n), 2 * m * k * n, 4 * m * k * n, k * n, 0, 0, (n, k))
    fwd = {b: selectable_cost(node, "fp8_e4m3", h100, b, boundary="fp32").fwd_ms for b in ("fp8", "bf16")}
    # the same forward but for its GEMM: 0.35 ms against 0.55 ms at the two factors
    assert fwd["bf16"] - fwd["fp8"] == pytest.approx(0.55 - 0.35, rel=0.02), fwd
