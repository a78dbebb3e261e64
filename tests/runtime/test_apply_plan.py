"""apply_plan / strip: what a user relies on when swapping a real model's operators by FQN."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from qsync_opt.errors import RuntimeSetupError
from qsync_opt.models.zoo import ZOO, build_model
from qsync_opt.runtime import QLinear, QuantizedModule, apply_plan, current_precisions, selectable_modules, strip


def _tiny_bert():
    torch.manual_seed(0)
    return build_model("tiny-bert").eval()


def _mixed_plan(model) -> dict[str, str]:
    cycle = ["int8", "bf16", "fp16", "fp8_e4m3", "int4", "fp32", "tf32"]
    return {n: cycle[i % len(cycle)] for i, n in enumerate(selectable_modules(model))}


def test_every_selectable_op_of_a_zoo_transformer_is_swapped_and_trains():
    model = _tiny_bert()
    names = list(selectable_modules(model))
    kinds = {type(m).__name__ for m in selectable_modules(model).values()}
    assert {"Linear", "MatMul", "Embedding"} <= kinds
    apply_plan(model, {n: "int8" for n in names}, strict=True)
    assert current_precisions(model) == {n: "int8" for n in names}
    (ids,), targets = ZOO["tiny-bert"].example_batch(4, generator=torch.Generator().manual_seed(0))
    loss = ZOO["tiny-bert"].loss_fn(model(ids), (ids, targets))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters() if p.requires_grad)


def test_apply_then_strip_round_trips_state_dict_and_outputs():
    model = _tiny_bert()
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(1))
    before_out = model(ids)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = {n: p for n, p in model.named_parameters()}
    apply_plan(model, _mixed_plan(model))
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    assert all(p is params[n] for n, p in model.named_parameters()), "parameters are shared, not copied"
    # a state dict saved from the quantized model loads into a plain one and vice versa
    plain = _tiny_bert()
    plain.load_state_dict(model.state_dict())
    model.load_state_dict(plain.state_dict())
    strip(model)
    assert not any(isinstance(m, QuantizedModule) for m in model.modules())
    assert type(model.bert.encoder.layer[0].attention.self.query) is nn.Linear
    assert torch.equal(model(ids), before_out)


def test_fp32_plan_is_identical_and_tf32_on_cpu_runs_fp32():
    model = _tiny_bert()
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(2))
    want = model(ids)
    names = list(selectable_modules(model))
    apply_plan(model, {n: "fp32" for n in names})
    assert not any(isinstance(m, QuantizedModule) for m in model.modules())
    assert torch.equal(model(ids), want)
    changes = apply_plan(copy.deepcopy(model), {n: "tf32" for n in names}, dry_run=True)
    assert all("fp32 on CPU" in c.note for c in changes)
    apply_plan(model, {n: "tf32" for n in names})
    assert all(isinstance(m, QuantizedModule) for m in selectable_modules(model).values())
    assert torch.equal(model(ids), want), "tf32 on CPU must be plain fp32 arithmetic"


def test_dry_run_lists_changes_and_touches_nothing():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    changes = apply_plan(model, {"0": "int8", "2": "fp32"}, dry_run=True)
    assert [(c.fqn, c.old_type, c.old_precision, c.new_precision, c.new_type) for c in changes] == [
        ("0", "Linear", "fp32", "int8", "QLinear"), ("2", "Linear", "fp32", "fp32", "Linear")]
    assert type(model[0]) is nn.Linear


def test_reapplying_changes_precision_and_fp32_restores_plain():
    model = nn.Sequential(nn.Linear(4, 4))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    apply_plan(model, {"0": "int8"})
    assert isinstance(model[0], QLinear) and model[0].precision == "int8"
    apply_plan(model, {"0": "bf16"})
    assert model[0].precision == "bf16" and type(model[0]).__mro__.count(QuantizedModule) == 1
    before = model[0].weight.detach().clone()
    model(torch.randn(3, 4)).sum().backward()
    optim.step()  # the optimizer built before the swaps still owns the live parameters
    assert not torch.equal(model[0].weight, before)
    apply_plan(model, {"0": "fp32"})
    assert type(model[0]) is nn.Linear


def test_root_module_can_be_swapped():
    lin = nn.Linear(3, 3)
    q = apply_plan(lin, {"": "int8"})
    assert isinstance(q, QLinear) and q.weight is lin.weight
    assert type(strip(q)) is nn.Linear


def test_unknown_fqn_lists_near_matches():
    model = _tiny_bert()
    with pytest.raises(RuntimeSetupError, match=r"bert\.encoder\.layer\.0\.attention\.self\.querry: no such module.*"
                                                r"near matches: bert\.encoder\.layer\.0\.attention\.self\.query"):
        apply_plan(model, {"bert.encoder.layer.0.attention.self.querry": "int8"})


def test_functional_op_fqn_points_to_matmul_module():
    model = _tiny_bert()
    with pytest.raises(RuntimeSetupError, match=r"bert\.encoder\.layer\.0\.attention\.self\.softmax_0: names a "
                                                r"functional op.*qsync_opt\.models\.layers\.MatMul"):
        apply_plan(model, {"bert.encoder.layer.0.attention.self.softmax_0": "int8"})


def test_unsupported_module_type_is_named_and_all_problems_reported_together():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    with pytest.raises(RuntimeSetupError) as e:
        apply_plan(model, {"1": "int8", "0": "int3", "7": "bf16"})
    msg = str(e.value)
    assert "3 problems" in msg
    assert "1: module type LayerNorm cannot be swapped; supported types: Linear, Conv1d, Conv2d, MatMul, Embedding" in msg
    assert "0: precision 'int3' is unknown" in msg and "7: no such module" in msg
    assert type(model[0]) is nn.Linear, "nothing is swapped when any entry is bad"


def test_strict_requires_every_selectable_module():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with pytest.raises(RuntimeSetupError, match=r"strict=True and the plan has no entry for 1 selectable module\(s\): 1"):
        apply_plan(model, {"0": "int8"}, strict=True)
    assert type(apply_plan(model, {"0": "int8"})[1]) is nn.Linear, "without strict, absent modules stay"


@pytest.mark.parametrize("kwarg,value", [("backward_precision", "fp4"), ("rounding", "up"),
                                          ("weight_granularity", "per_row"), ("kernels", "cuda")])
def test_bad_runtime_options_name_the_option(kwarg, value):
    with pytest.raises(RuntimeSetupError, match=f"{kwarg}='{value}' is not accepted; use one of"):
        apply_plan(nn.Linear(2, 2), {"": "int8"}, **{kwarg: value})


def test_casts_and_quantization_are_visible_to_the_profiler():
    model = apply_plan(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), {"0": "bf16", "1": "int8"})
    x = torch.randn(4, 8, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(x).sum().backward()
    names = {e.name for e in prof.events()}
    for want in ("qsync::cast[fp32->bf16]", "qsync::cast[bf16->fp32]", "qsync::quantize[int8]",
                 "qsync::gemm[int8]", "qsync::backward[int8@bfloat16]"):
        assert want in names, f"{want} not in profile"
