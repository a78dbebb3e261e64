"""The planner under runtime.backward_precision: fp8 prices what the runtime then runs: an fp8 linear's backward GEMMs
at the fp8 rate of the implementation dispatch names, everything else at the 16-bit fallback; the indicator takes the
e5m2 gradient; measured times under another runtime setting are never reused."""

from __future__ import annotations

import pytest

from predictor_graphs import conv, deep_mlp_graph, flat_omega, linear
from qsync_opt.hardware.calibration import gemm_factor
from qsync_opt.hardware.device import find_device
from qsync_opt.kernels.dispatch import Target, fp8_backward_impl
from qsync_opt.training.predictor.costs import fp8_grads, selectable_cost
from qsync_opt.training.predictor.gvar import gradient_format
from qsync_opt.training.predictor.instance_builder import build_instance
from qsync_opt.training.predictor.profile import Profile, runtime_tag
from qsync_opt.training.spec import RuntimeSpec, load_spec

BIG = linear("fc", 8192, 4096, 4096, depth=1)


def _ms(node, p, device, backward):
    return selectable_cost(node, p, find_device(device), backward, boundary="fp32")


@pytest.mark.parametrize("device", ["H100-SXM", "H200", "L4"])
def test_fp8_linear_backward_is_priced_at_the_rate_of_the_gemm_that_runs(device):
    """At the fp8 rate of what dispatch runs: the GEMM factor measured for that implementation on the architecture
    (sm_90: torch._scaled_mm timed alone on the H200), else the catalog's fp8 efficiency (L4, sm_89)."""
    d = find_device(device)
    fp8, b16 = _ms(BIG, "fp8_e4m3", device, "fp8"), _ms(BIG, "fp8_e4m3", device, "bf16")
    if d.calibration("fp8_e4m3", "linear") is None:  # (a calibrated factor is of the whole module: not split)
        assert fp8.fwd_ms == b16.fwd_ms
    impl = fp8_backward_impl(Target.of_device_spec(d), "fp8_e4m3", d.kernels)
    f = gemm_factor(d, "fp8_e4m3", impl)
    assert (f is not None) == (d.sm == 90)
    eff = f.factor if f is not None else d.efficiency.get("fp8", 0.6)
    gemms = BIG.bwd_flops / (d.peak_tflops["fp8"] * 1e12 * eff) * 1e3
    assert gemms <= fp8.bwd_ms, (fp8.bwd_ms, gemms)  # + the gradient's quantization and the transposes
    if f is None:
        assert fp8.bwd_ms < b16.bwd_ms
    else:  # HBM: those passes are small beside the GEMMs
        assert fp8.bwd_ms <= 1.3 * gemms


def test_a_kernel_measured_slow_is_priced_slow():
    """fp8_e5m2's backward GEMMs run the templated mma kernel, which the H200 timed at about 6% of the fp8 peak:
    under an fp8 backward that linear costs more on sm_90 than its bf16 module, not the datasheet's less."""
    for device in ("H100-SXM", "H200"):
        assert _ms(BIG, "fp8_e5m2", device, "fp8").total_ms > _ms(BIG, "bf16", device, "bf16").total_ms
    assert _ms(BIG, "fp8_e5m2", "L4", "fp8").total_ms < _ms(BIG, "bf16", "L4", "bf16").total_ms  # sm_89: unmeasured


@pytest.mark.parametrize("node,p", [(conv("c", 64, 256, 256, 28, depth=1), "fp8_e4m3"), (BIG, "int8"),
                                    (BIG, "int4"), (BIG, "bf16"), (BIG, "fp32")])
def test_everything_else_is_priced_at_the_16_bit_fallback(node, p):
    for device in ("H100-SXM", "L4", "T4"):
        if not find_device(device).supports(p):
            continue
        assert not fp8_grads(node.kind, p, "fp8")
        assert _ms(node, p, device, "fp8") == _ms(node, p, device, "bf16")


def test_without_fp8_tensor_cores_the_backward_is_priced_as_the_fp32_gemm_it_is():
    """On an A100 (sm_80) fp8 is emulated by fp32 GEMMs, and so would its fp8 backward be (it is not offered)."""
    a100 = find_device("A100-80GB")
    c = _ms(BIG, "fp8_e4m3", "A100-80GB", "fp8")
    assert c.bwd_ms >= BIG.bwd_flops / a100.achieved_flops("fp32") * 1e3


def _instance(device: str, backward: str):
    graph = deep_mlp_graph(batch=4096, width=2048, layers=5)
    spec = load_spec(f"""
cluster:
  groups:
    - {{name: gpu, device: {device}, count: 1}}
model: {{name: resnet50}}
training: {{global_batch: 4096, optimizer: adamw}}
runtime: {{backward_precision: {backward}}}
objective: {{minimize: accuracy_degradation, max_iteration_time: 10.0}}
""")
    return build_instance(spec, graph, flat_omega(graph), boundary="fp32")


def test_a_calibrated_group_does_not_claim_calibration_for_fp8_linears_with_fp8_grads():
    """The sm_90 factors were fitted on fp8 modules with a bf16 backward: under fp8 grads those ops are datasheet."""
    _, ctx = _instance("H200", "bf16")
    assert "fp8_e4m3" in ctx.group("gpu").cost_source.split(" priced by")[0]
    _, ctx = _instance("H200", "fp8")
    head = ctx.group("gpu").cost_source.split(" priced by")[0]
    assert head == "roofline, calibrated: linear ops at fp32, tf32, bf16, fp16, int8", head
    gc = ctx.group("gpu")
    assert gc.costs["fc0"]["fp8_e4m3"].bwd_ms < _instance("H200", "bf16")[1].group("gpu").costs["fc0"]["fp8_e4m3"].bwd_ms


@pytest.mark.parametrize("kind,p,backward,want", [
    ("linear", "fp8_e4m3", "fp8", "fp8_e5m2"), ("linear", "fp8_e5m2", "fp8", "fp8_e5m2"),
    ("conv2d", "fp8_e4m3", "fp8", "bf16"), ("matmul", "fp8_e4m3", "fp8", "bf16"), ("linear", "int8", "fp8", "bf16"),
    ("linear", "fp16", "fp8", "fp16"), ("linear", "fp8_e4m3", "fp16", "fp16"), ("linear", "int8", "fp32", "fp32")])
def test_the_indicator_takes_the_gradient_format_the_runtime_multiplies(kind, p, backward, want):
    assert gradient_format(kind, p, backward) == want


def test_measured_times_under_another_runtime_setting_are_a_section_of_their_own():
    assert runtime_tag(RuntimeSpec()) == ""
    assert runtime_tag(RuntimeSpec(backward_precision="fp8")) == "backward_precision=fp8"
    assert runtime_tag(RuntimeSpec(kernels="torch", rounding="stochastic")) == "kernels=torch,rounding=stochastic"
    prof = Profile({"kind": "cpu"}, {}, "now")
    prof.section({}, 2).ops["x"] = {"fwd_ms": 1.0, "bwd_ms": 2.0}
    assert prof.find_section({}, 2, runtime="backward_precision=fp8") is None
    prof.section({}, 2, runtime="backward_precision=fp8")
    assert len(prof.sections) == 2 and prof.find_section({}, 2).ops


def test_the_scaled_mm_epilogue_is_priced_as_it_runs():
    """torch._scaled_mm takes fp8's per-tensor scales into cuBLASLt's epilogue: only a bias is a pass over the output;
    torch._int_mm's int32 accumulator still needs the scale pass and the bias pass."""
    from qsync_opt.training.predictor.costs import gemm_extras_ms, has_bias, kernel_ms

    h100 = find_device("H100-SXM")
    plain = linear("fc", 8192, 4096, 4096, depth=1, bias=False)
    one_pass = kernel_ms(0, 8 * BIG.output_numel, "fp32", h100, launches=1)
    assert has_bias(BIG) and not has_bias(plain)
    assert gemm_extras_ms(plain, "fp8_e4m3", h100) == 0.0
    assert gemm_extras_ms(BIG, "fp8_e4m3", h100) == pytest.approx(one_pass)
    assert gemm_extras_ms(plain, "int8", h100) == pytest.approx(kernel_ms(0, 16 * BIG.output_numel, "fp32", h100, 2))


def test_the_plan_notes_say_what_an_fp8_backward_does_here():
    _, ctx = _instance("L4", "fp8")
    assert ("runtime.backward_precision fp8: fp8 linears of gpu run both backward GEMMs in fp8 (e5m2 gradients); "
            "every other quantized op's backward runs in bf16") in ctx.notes
    _, ctx = _instance("A100-80GB", "fp8")
    assert any(n.startswith("runtime.backward_precision fp8 changes no op here: no group's device runs fp8 (sm_89+)")
               for n in ctx.notes), ctx.notes
    _, ctx = _instance("H200", "fp8")  # runs fp8, but every fp8 linear is dropped as slower than bf16 (measured)
    assert any(n.startswith("runtime.backward_precision fp8 changes no op here: gpu run(s) fp8, but no linear is "
                            "offered an fp8 format there") for n in ctx.notes), ctx.notes
    _, ctx = _instance("L4", "bf16")
    assert not any("backward_precision" in n for n in ctx.notes)
