"""GVAR and Hessian indicators agree with float64 references on a tiny model; the spec
selects the method, a checkpoint is loaded, and results are cached by model, weights, data
and method."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from qsync_opt.errors import SpecError
from qsync_opt.models.tracing import trace
from qsync_opt.training.predictor.gvar import collect_stats
from qsync_opt.training.predictor.hessian import hessian_indicator, hutchinson_traces, quantisation_error
from qsync_opt.training.predictor.indicators import compute_indicator
from qsync_opt.training.spec import load_spec


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _batches(n=2, b=6, dtype=torch.float64):
    g = torch.Generator().manual_seed(1)
    return [((torch.randn(b, 4, generator=g, dtype=dtype),), torch.randint(0, 3, (b,), generator=g)) for _ in range(n)]


def _loss(out, targets):
    return nn.functional.cross_entropy(out, targets)


def _exact_hessian(model, batches):
    """The full float64 Hessian of the mean-over-batches loss w.r.t. (fc1.weight, fc2.weight), flattened."""
    w1, w2 = model.fc1.weight.detach(), model.fc2.weight.detach()
    n1 = w1.numel()

    def f(flat):
        a, b = flat[:n1].view_as(w1), flat[n1:].view_as(w2)
        total = 0.0
        for (x,), t in batches:
            y = nn.functional.linear(torch.tanh(nn.functional.linear(x, a, model.fc1.bias.detach())), b,
                                     model.fc2.bias.detach())
            total = total + _loss(y, t)
        return total / len(batches)

    return torch.autograd.functional.hessian(f, torch.cat([w1.reshape(-1), w2.reshape(-1)])), n1


def test_hutchinson_equals_the_float64_quadratic_form_of_its_probes():
    torch.manual_seed(0)
    model = Tiny().double()
    batches = _batches()
    weights = {"fc1": model.fc1.weight, "fc2": model.fc2.weight}
    probes, seed = 5, 3
    est = hutchinson_traces(model, weights, batches, _loss, probes=probes, seed=seed)
    # the same Rademacher probes, drawn in the same order, against the exact float64 Hessian's
    # diagonal blocks: op i's sample is v_i · H_ii v_i
    g = torch.Generator().manual_seed(seed)
    ref = {"fc1": 0.0, "fc2": 0.0}
    for b in batches:
        H, n1 = _exact_hessian(model, [b])
        blocks = {"fc1": H[:n1, :n1], "fc2": H[n1:, n1:]}
        for _ in range(probes):
            for name, w in weights.items():
                v = (torch.randint(0, 2, w.shape, generator=g) * 2 - 1).double().reshape(-1)
                ref[name] += float(v @ blocks[name] @ v)
    for name in ref:
        assert est[name] == pytest.approx(ref[name] / (probes * len(batches)), rel=1e-9)
    # and it estimates the trace: many probes land near the exact block traces
    H, n1 = _exact_hessian(model, batches)
    exact = {"fc1": float(torch.trace(H[:n1, :n1])), "fc2": float(torch.trace(H[n1:, n1:]))}
    many = hutchinson_traces(model, weights, batches, _loss, probes=400, seed=0)
    for name in ref:
        assert many[name] == pytest.approx(exact[name], rel=0.15)


def test_hessian_indicator_float32_agrees_with_float64():
    torch.manual_seed(0)
    m64 = Tiny().double()
    m32 = Tiny().float()
    m32.load_state_dict({k: v.float() for k, v in m64.state_dict().items()})
    graph = trace(Tiny(), torch.randn(1, 4))
    b64 = _batches()
    b32 = [((x.float(),), t) for (x,), t in b64]
    ps = ("fp32", "bf16", "int8", "int4")
    s64 = hessian_indicator(m64, graph, b64, _loss, ps, probes=6, seed=2)
    s32 = hessian_indicator(m32, graph, b32, _loss, ps, probes=6, seed=2)
    for op in s64.omega:
        for p in ps:
            assert s32.omega[op][p] == pytest.approx(s64.omega[op][p], rel=1e-3, abs=1e-9)
    assert s64.method == "hessian" and all(s64.omega[op]["fp32"] == 0.0 for op in s64.omega)
    assert all(s64.omega[op]["int4"] > s64.omega[op]["int8"] > s64.omega[op]["bf16"] for op in s64.omega)


def test_quantisation_error_by_hand():
    w = torch.tensor([1.0, -0.5, 0.26])
    s = 1.0 / 127
    expected = sum((round(x / s) * s - x) ** 2 for x in w.tolist())  # the float32 values, in float64
    assert quantisation_error(w, "int8") == pytest.approx(expected, rel=1e-12)
    assert quantisation_error(w, "fp32") == 0.0
    assert quantisation_error(torch.tensor([1.0 + 2**-9]), "bf16") == pytest.approx(2**-18)  # rounds to 1.0


def test_gvar_statistics_match_a_float64_reference():
    torch.manual_seed(0)
    m64 = Tiny().double()
    m32 = Tiny()
    m32.load_state_dict({k: v.float() for k, v in m64.state_dict().items()})
    b64 = _batches()
    stats = collect_stats(m32, ["fc1", "fc2"], [((x.float(),), t) for (x,), t in b64],
                          lambda out, batch: _loss(out, batch[1]))
    # float64 reference: per batch, the inputs, weights, output gradients and weight gradients
    ref = {n: {"x_norm": 0.0, "x_amax": 0.0, "gw_norm": 0.0, "g_ms": 0.0, "w_norm": 0.0} for n in ("fc1", "fc2")}
    for (x,), t in b64:
        m64.zero_grad()
        h_in = x
        a1 = m64.fc1(h_in)
        a1.retain_grad()
        h = torch.tanh(a1)
        y = m64.fc2(h)
        y.retain_grad()
        _loss(y, t).backward()
        for name, xin, out in (("fc1", h_in, a1), ("fc2", h, y)):
            w = getattr(m64, name).weight
            r = ref[name]
            r["x_norm"] += float(xin.detach().norm()) / len(b64)
            r["x_amax"] += float(xin.detach().abs().max()) / len(b64)
            r["gw_norm"] += float(w.grad.norm()) / len(b64)
            r["g_ms"] += float((out.grad ** 2).mean()) / len(b64)
            r["w_norm"] += float(w.detach().norm()) / len(b64)
    for name, r in ref.items():
        for key, value in r.items():
            assert getattr(stats[name], key) == pytest.approx(value, rel=1e-5), (name, key)
        assert stats[name].d_x == 6 * (4 if name == "fc1" else 5)


SPEC = """
cluster:
  groups: [{name: cpu, device: cpu-local}]
model: {name: tiny-cnn}
training: {global_batch: 8, optimizer: sgd}
indicator: {method: %s, calibration: {batches: 1, batch_size: 4}}
"""


@pytest.mark.parametrize("method", ["gvar", "hessian", "empirical"])
def test_spec_selects_the_method_and_caches(method, tmp_path, monkeypatch):
    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path))
    spec = load_spec(SPEC % method)
    sens, note = compute_indicator(spec)
    assert sens.method == method and method in note and "cached" in note
    assert all(v["fp32"] == 0.0 for v in sens.omega.values())
    assert math.isclose(sum(v[sens.reference] for v in sens.omega.values()), 1.0, rel_tol=1e-9)
    files = list((tmp_path / "indicators").glob(f"{method}-*.json"))
    assert len(files) == 1
    again, note2 = compute_indicator(spec)
    assert again.omega == sens.omega and f"cached {files[0]}" in note2
    # other weights (a checkpoint) -> another cache entry
    from qsync_opt.models.zoo import build_model

    torch.manual_seed(123)
    ck = tmp_path / "w.pt"
    torch.save(build_model("tiny-cnn").state_dict(), ck)
    spec2 = load_spec((SPEC % method).replace("model: {name: tiny-cnn}", f"model: {{name: tiny-cnn, checkpoint: {ck}}}"))
    other, _ = compute_indicator(spec2)
    assert len(list((tmp_path / "indicators").glob(f"{method}-*.json"))) == 2
    assert other.omega != sens.omega


def test_bad_checkpoint_names_the_field(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_text("not a checkpoint")
    spec = load_spec((SPEC % "gvar").replace("model: {name: tiny-cnn}", f"model: {{name: tiny-cnn, checkpoint: {bad}}}"))
    with pytest.raises(SpecError, match="model.checkpoint"):
        compute_indicator(spec)
    with pytest.raises(SpecError, match="indicator.method"):
        load_spec(SPEC % "guess")


def test_calibration_batches_are_the_jobs_own_data_and_key_the_cache():
    """GVAR/Hessian/empirical measure sensitivity on what the job trains on, not a stand-in task."""
    from qsync_opt.data.task import build_task
    from qsync_opt.models.zoo import build_model
    from qsync_opt.training.predictor.indicators import cache_key, calibration_batches

    synthetic = load_spec(SPEC % "gvar")
    digits = load_spec(SPEC % "gvar" + "data: {name: digits}\n")
    (x, ), y = calibration_batches(digits)[0]
    (ref, ), ref_y = build_task(digits).samples(0, 4)
    assert torch.equal(x, ref) and torch.equal(y, ref_y)
    assert x.shape[1:] == (1, 8, 8) and 0.0 <= float(x.min()) and float(x.max()) <= 1.0  # digits / 16
    (sx, ), _ = calibration_batches(synthetic)[0]
    assert sx.shape != x.shape or not torch.equal(sx, x)
    model = build_model("tiny-cnn")
    assert cache_key(digits, model, ("fp32", "int8")) != cache_key(synthetic, model, ("fp32", "int8"))
