"""Roofline op costs: one op by hand, the precision rules, and QSync's 'not faster here' case."""

from __future__ import annotations

import pytest

from predictor_graphs import conv, elementwise, linear, mlp_graph
from qsync_opt.errors import SpecError
from qsync_opt.hardware.device import find_device
from qsync_opt.training.predictor.casts import cast_ms
from qsync_opt.training.predictor.costs import fixed_cost, op_costs, optimizer_ms, selectable_cost

A100, T4, V100 = find_device("A100-40GB"), find_device("T4"), find_device("V100-32GB")
BPMS = 1555e9 * 0.8 / 1e3  # A100-40GB achieved bytes per ms
BIG = linear("big", 1024, 1024, 1024, 0)  # 1024 x 1024 GEMM with bias, batch 1024
RESNET_CONV = conv("layer1.conv2", 32, 64, 64, 56, 3)  # a typical ResNet-50 3x3 conv


def test_linear_bf16_on_a100_by_hand():
    n_in = n_out = 1024 * 1024
    n_w = 1024 * 1024 + 1024
    flops = 2 * 1024**3 + 1024 * 1024
    achieved = 312e12 * 0.6 / 1e3  # FLOP per ms
    fwd = max(flops / achieved, (2 * n_in + 2 * n_w + 2 * n_out) / BPMS) + 5e-3
    bwd_bytes = 2 * 2 * n_out + 2 * n_w + 2 * n_in + 2 * n_in + 4 * n_w
    bwd = max(2 * flops / achieved, bwd_bytes / BPMS) + 2 * 5e-3
    wcast = 6 * n_w / BPMS + 5e-3
    c = selectable_cost(BIG, "bf16", A100, "bf16")
    assert c.fwd_ms == pytest.approx(fwd, rel=1e-12)
    assert c.bwd_ms == pytest.approx(bwd, rel=1e-12)
    assert c.weight_cast_ms == pytest.approx(wcast, rel=1e-12)
    assert c.total_ms == pytest.approx(fwd + bwd + wcast, rel=1e-12)


def test_relu_is_memory_bound_by_hand():
    node = elementwise("act", "relu", (1024, 1024), 1)
    n = 1024 * 1024
    c = fixed_cost(node, A100)
    assert c.fwd_ms == pytest.approx(8 * n / BPMS + 5e-3)
    assert c.bwd_ms == pytest.approx(12 * n / BPMS + 5e-3)


def test_optimizer_step_by_hand():
    g = mlp_graph()  # 64*128+128 + 128*10+10 = 9610 parameters in 2 ops
    assert g.param_count == 9610
    assert optimizer_ms(g, "adam", A100) == pytest.approx(4 * 9610 * 7 / BPMS + 2 * 5e-3)
    assert optimizer_ms(g, "sgd", A100) == pytest.approx(4 * 9610 * 3 / BPMS + 2 * 5e-3)
    with pytest.raises(SpecError, match="training.optimizer: 'lion'.*adamw"):
        optimizer_ms(g, "lion", A100)


def test_only_native_precisions_are_offered():
    costs = op_costs(mlp_graph(), T4, precisions=["fp32", "bf16", "int8", "int4"])
    assert set(costs["fc1"]) == {"fp32", "int8", "int4"}  # T4 has no bf16
    assert set(op_costs(mlp_graph(), find_device("H100-SXM"))["fc2"]) >= {"fp8_e4m3", "int8"}
    assert "int4" not in op_costs(mlp_graph(), find_device("H100-SXM"))["fc2"]
    with pytest.raises(SpecError, match=r"precisions: none of \['bf16'\] runs natively on T4"):
        op_costs(mlp_graph(), T4, precisions=["bf16"])


def test_low_precision_backward_runs_at_the_backward_precision():
    # On T4 the runtime's bf16 backward falls back to fp16: int8 and fp16 differ only in forward.
    i8, f16 = selectable_cost(RESNET_CONV, "int8", T4, "bf16"), selectable_cost(RESNET_CONV, "fp16", T4, "bf16")
    assert i8.bwd_ms == pytest.approx(f16.bwd_ms, rel=0.02)  # saved input and weight read at 8 bits
    assert i8.bwd_ms <= f16.bwd_ms
    assert i8.fwd_ms != pytest.approx(f16.fwd_ms)
    # with an fp32 backward, an int8 op's backward costs what an fp32 backward does
    i8_32 = selectable_cost(BIG, "int8", A100, "fp32")
    assert i8_32.bwd_ms == pytest.approx(selectable_cost(BIG, "fp32", A100, "fp32").bwd_ms, rel=0.05)


def test_lower_precision_is_faster_for_big_gemms_on_a100():
    # K = 8192: at K = 4096 the unfused epilogue of the library int8 GEMM (torch._int_mm, two
    # passes over the 4096 x 4096 output) costs as much as the int8 GEMM saves over bf16.
    huge = linear("huge", 4096, 8192, 4096, 0)
    t = {p: selectable_cost(huge, p, A100, "bf16").total_ms for p in ("fp32", "tf32", "bf16", "int8", "int4")}
    assert t["fp32"] > t["tf32"] > t["bf16"] > t["int8"] > t["int4"]
    # at 1024^3 the int8 quantise and weight-cast passes eat the GEMM's gain
    assert selectable_cost(BIG, "int8", A100, "bf16").total_ms > selectable_cost(BIG, "bf16", A100, "bf16").total_ms


def test_t4_int8_conv_is_slower_than_fp16_as_qsync_measured():
    i8, f16 = selectable_cost(RESNET_CONV, "int8", T4, "fp16"), selectable_cost(RESNET_CONV, "fp16", T4, "fp16")
    assert i8.total_ms > f16.total_ms
    # ... because of the input quantisation (published fp16 -> int8 fit) and the weaker int8 GEMM
    quant = cast_ms(RESNET_CONV.input_numel, "fp16", "int8", T4)
    assert i8.fwd_ms > quant > 0


def test_weight_casts_only_below_fp32_storage():
    assert selectable_cost(BIG, "fp32", A100, "bf16").weight_cast_ms == 0.0
    assert selectable_cost(BIG, "tf32", A100, "bf16").weight_cast_ms == 0.0
    assert selectable_cost(BIG, "int8", A100, "bf16").weight_cast_ms > selectable_cost(BIG, "bf16", A100, "bf16").weight_cast_ms


def test_fp32_boundary_charges_the_ops_own_casts():
    edge, own = selectable_cost(BIG, "bf16", A100, "bf16"), selectable_cost(BIG, "bf16", A100, "bf16", boundary="fp32")
    n = 1024 * 1024
    assert own.fwd_ms - edge.fwd_ms == pytest.approx(cast_ms(n, "fp32", "bf16", A100) + cast_ms(n, "bf16", "fp32", A100))
    assert own.bwd_ms - edge.bwd_ms == pytest.approx(cast_ms(n, "fp32", "bf16", A100) + cast_ms(n, "bf16", "fp32", A100))
    same = selectable_cost(BIG, "fp32", A100, "bf16", boundary="fp32")
    assert same == selectable_cost(BIG, "fp32", A100, "bf16")
    with pytest.raises(SpecError, match="boundary: got 'both'"):
        op_costs(mlp_graph(), A100, boundary="both")


def test_costs_scale_with_batch():
    small = mlp_graph(batch=256, fin=2048, hidden=2048)
    large = small.for_batch(4096)
    a = op_costs(small, V100)["fc1"]["fp32"].total_ms
    b = op_costs(large, V100)["fc1"]["fp32"].total_ms
    assert b > 4 * a


def test_costs_follow_the_implementation_dispatch_runs():
    from qsync_opt.kernels.dispatch import implementation

    # T4 int4 is the templated s4 kernel (int4 rate, plus the packing pass); under kernels='torch'
    # it is the int8 library GEMM on ±7 codes: int8 rate, unfused epilogue, and no faster than int8.
    t4_torch = T4.with_kernels("torch")
    assert implementation(T4, "int4").op == "qsync.cuda.int4_wmma" and T4.rate_key("int4") == "int4"
    assert t4_torch.rate_key("int4") == "int8" and "int4" in t4_torch.precisions
    huge = linear("huge", 4096, 8192, 4096, 0)
    assert selectable_cost(huge, "int4", t4_torch, "fp16").fwd_ms == pytest.approx(
        selectable_cost(huge, "int8", t4_torch, "fp16").fwd_ms)
    assert selectable_cost(huge, "int4", T4, "fp16").fwd_ms < selectable_cost(huge, "int4", t4_torch, "fp16").fwd_ms
    # V100 under kernels='templated': no templated int8 GEMM before sm_75, so int8 is not offered
    assert "int8" in V100.precisions and "int8" not in V100.with_kernels("templated").precisions
    with pytest.raises(ValueError, match="runtime.kernels: 'fast'"):
        T4.with_kernels("fast")


def test_library_epilogue_and_int4_packing_are_charged():
    from qsync_opt.training.predictor.costs import gemm_extras_ms, kernel_ms

    n = BIG.output_numel
    assert gemm_extras_ms(BIG, "int8", A100) == pytest.approx(kernel_ms(0, 16 * n, "fp32", A100, launches=2))
    assert gemm_extras_ms(BIG, "int8", find_device("cpu-local")) == 0.0  # the CPU kernel fuses its epilogue
    packed = 1.5 * (BIG.input_numel + BIG.param_count)
    assert gemm_extras_ms(BIG, "int4", T4) == pytest.approx(kernel_ms(0, packed, "fp32", T4, launches=2))
    assert gemm_extras_ms(BIG, "bf16", A100) == 0.0
