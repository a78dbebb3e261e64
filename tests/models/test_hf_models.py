"""Hugging Face transformers models (BERT, GPT-2, Llama-style) from a factory beside the spec:
captured with torch.export, planned per operator, applied and trained on two CPU groups, one of
which may only run low precisions."""

from __future__ import annotations

import copy
import sys
import textwrap

import pytest
import torch
import yaml
from torch import nn

from qsync_opt.errors import ModelError, RuntimeSetupError
from qsync_opt.models import trace
from qsync_opt.runtime.apply import apply_plan, check_fingerprint
from qsync_opt.runtime.qmodules import QuantizedModule

T = pytest.importorskip("transformers")

FACTORIES = textwrap.dedent('''
    import transformers as T

    def bert(vocab_size=300, hidden=32, **kw):
        return T.BertForSequenceClassification(T.BertConfig(
            vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=64, num_labels=3, **kw))

    def gpt2(vocab_size=300, hidden=32, **kw):
        return T.GPT2LMHeadModel(T.GPT2Config(
            vocab_size=vocab_size, n_embd=hidden, n_layer=2, n_head=2, n_positions=64, bos_token_id=0,
            eos_token_id=0, use_cache=False, **kw))

    def llama(vocab_size=300, hidden=32, **kw):
        return T.LlamaForCausalLM(T.LlamaConfig(
            vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, use_cache=False, **kw))
''')
LOW = ("bf16", "int8")
SEQ = 16


def write_spec(folder, model: str, module: str, *, data=None, steps=3):
    """A two-group CPU job whose model is `<module>:<model>` in a file beside the spec."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(FACTORIES)
    spec = {
        "name": f"hf-{model}", "kind": "training",
        "cluster": {"interconnect": "loopback", "groups": [
            {"name": "fast", "device": "cpu-local", "count": 1, "local_batch": 6},
            {"name": "low", "device": "cpu-local", "count": 1, "local_batch": 2, "precisions": list(LOW)}]},
        "model": {"import": f"{module}:{model}", "input_shape": [SEQ], "input_dtype": "int64",
                  "kwargs": {"vocab_size": 300}, "output": "logits"},
        "training": {"global_batch": 8, "optimizer": "adamw", "lr": 1e-3, "steps": steps, "seed": 1},
        "objective": {"minimize": "accuracy_degradation", "max_iteration_time": 1000},
        "solver": {"backend": "default", "time_limit_s": 10},
    }
    if data:
        spec["data"] = data
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _plannable(model: nn.Module) -> dict[str, nn.Module]:
    conv1d = T.pytorch_utils.Conv1D
    return {n: m for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding, conv1d))}


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """model -> (spec path, plan, factory module): each solved once, from another working directory."""
    from qsync_opt.training.pipeline import solve

    root = tmp_path_factory.mktemp("hf")
    out = {}
    for model in ("bert", "gpt2", "llama"):
        module = f"hf_factories_{model}"
        spec = write_spec(root / model, model, module)
        cwd = root / "elsewhere"
        cwd.mkdir(exist_ok=True)
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(cwd)  # neither the spec's folder nor PYTHONPATH: solve must find the factory beside the spec
            plan = solve(spec)
        out[model] = (spec, plan, sys.modules[module])
    return out


@pytest.mark.parametrize("model", ["bert", "gpt2", "llama"])
def test_solve_plans_every_linear_and_embedding_as_its_own_operator(solved, model):
    spec, plan, factories = solved[model]
    net = getattr(factories, model)(vocab_size=300)
    want = _plannable(net)
    tied = {n for n, m in want.items() if n == "lm_head" and m.weight is net.get_input_embeddings().weight}
    assert set(plan.fingerprint.ops) == set(want)  # every linear / Conv1D / embedding, nothing else
    for name, m in want.items():
        kind = "embedding" if isinstance(m, nn.Embedding) else "linear"
        shape = tuple(m.weight.shape)[:: -1 if isinstance(m, T.pytorch_utils.Conv1D) else 1]  # Conv1D stores (in, out)
        assert plan.fingerprint.ops[name] == f"{kind}[{','.join(map(str, shape))}]", name
    for g in plan.groups.values():
        assert set(g.precisions) == set(want)
    assert set(plan.groups["low"].precisions.values()) <= set(LOW)  # the group without fp32 got none
    assert model != "gpt2" or tied == {"lm_head"}  # GPT-2's head shares the embedding and is still planned
    assert any("scaled_dot_product_attention" in n for n in plan.solver.notes)  # why attention stays fp32
    costs = [n for n in plan.solver.notes if n.startswith("costs of")]
    assert len(costs) == 2 and all("roofline" in n and "torch.export" in n for n in costs), costs
    assert not any("qsync-opt profile" in n for n in plan.solver.notes)  # the profiler refuses exported models


@pytest.mark.parametrize("model", ["bert", "gpt2", "llama"])
def test_plan_applies_and_trains_three_steps_on_each_group(solved, model):
    from qsync_opt.data.task import build_task
    from qsync_opt.models.from_spec import build_from_spec
    from qsync_opt.training.spec import load_spec

    spec_path, plan, _ = solved[model]
    spec = load_spec(spec_path)
    task = build_task(spec)  # synthetic teacher task: labels from a frozen copy of the model
    torch.manual_seed(0)
    base = build_from_spec(spec)
    for group in ("fast", "low"):
        net = apply_plan(copy.deepcopy(base), plan, group)
        swapped = {n: m.recipe.precision for n, m in net.named_modules() if isinstance(m, QuantizedModule)}
        if group == "low":
            assert swapped == plan.groups["low"].precisions  # every op runs its planned low precision
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        losses = []
        for step in range(3):
            inputs, targets = task.batch(step, 8, 0, plan.groups[group].local_batch)
            loss = task.loss(net(*inputs), targets)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert all(torch.isfinite(torch.tensor(losses))), (group, losses)
        gemms = [m for m in _plannable(net).values() if not isinstance(m, nn.Embedding)]
        assert gemms and all(m.weight.grad is not None and torch.isfinite(m.weight.grad).all() for m in gemms)


@pytest.mark.parametrize("model", ["bert", "gpt2", "llama"])
def test_plan_fingerprint_refuses_another_config(solved, model):
    _, plan, factories = solved[model]
    check_fingerprint(getattr(factories, model)(vocab_size=300), plan)  # the model it was solved for
    with pytest.raises(RuntimeSetupError, match=r"does not fit this .*: operator '[\w.]+' is (linear|embedding)\["):
        check_fingerprint(getattr(factories, model)(vocab_size=300, hidden=48), plan)


def test_gpt2_conv1d_runs_the_planned_precision_with_its_weight_transposed():
    cfg = T.GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=16, use_cache=False,
                       bos_token_id=0, eos_token_id=0)
    net = T.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    ref = net(ids).logits
    ref.sum().backward()
    ref_grad = net.transformer.h[0].attn.c_attn.weight.grad.clone()
    net.zero_grad()
    for p, tol in (("fp16", 2e-3), ("int8", 5e-2)):
        q = apply_plan(copy.deepcopy(net), {"transformer.h.0.attn.c_attn": p, "transformer.h.0.mlp.c_fc": p})
        layer = q.transformer.h[0].attn.c_attn
        assert isinstance(layer, T.pytorch_utils.Conv1D) and layer.recipe.precision == p
        out = q(ids).logits
        assert (out - ref).abs().max().item() < tol * ref.abs().max().item()
        out.sum().backward()
        assert layer.weight.grad.shape == layer.weight.shape == (32, 96)
        # the gradient of the stored (in, out) weight, not of a reshaped one
        assert (layer.weight.grad - ref_grad).norm() < 0.05 * ref_grad.norm()


def test_graph_keeps_module_fqns_shapes_and_costs():
    net = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                           num_key_value_heads=2, intermediate_size=64, use_cache=False))
    from qsync_opt.models.output_select import select_output

    g = trace(select_output(net, "logits"), torch.randint(0, 100, (2, 8)), model_name="llama")
    k = g.node("model.layers.0.self_attn.k_proj")  # GQA: 2 KV heads of 8
    assert k.selectable and k.kind == "linear" and k.weight_shape == (16, 32)
    assert k.input_shapes == ((2, 8, 32),) and k.output_shape == (2, 8, 16) and k.fwd_flops == 2 * 2 * 8 * 16 * 32
    attn = g.node("model.layers.0.self_attn.scaled_dot_product_attention_0")
    assert attn.kind == "sdpa" and not attn.selectable and attn.input_shapes[0] == (2, 4, 8, 8)
    pre = "model.layers.0."
    # v reaches o_proj through the attention call; q and k through RoPE's add as well, which (like a
    # residual) counts as a merge, so at MAX_MERGES = 1 their pairs with o_proj are not cast edges
    assert (pre + "self_attn.v_proj", pre + "self_attn.o_proj") in g.selectable_edges
    assert (pre + "self_attn.q_proj", pre + "self_attn.o_proj") not in g.selectable_edges
    assert (pre + "mlp.up_proj", pre + "mlp.down_proj") in g.selectable_edges  # the gated product
    assert g.param_count == sum(p.numel() for p in net.parameters())


class _Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) if x.sum() > 0 else x  # data-dependent: neither fx nor torch.export follows it


class _ShapeBranch(nn.Module):
    """fx cannot follow the shape test; torch.export can, and then meets the data-dependent gate."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.gate = _Gate()

    def forward(self, x):
        x = self.a(x)
        return self.gate(x) if x.shape[0] > 1 else x


def test_data_dependent_control_flow_still_names_the_module():
    with pytest.raises(ModelError, match=r"torch\.export could not capture it either.*module 'gate' \(_Gate\).*"
                                         r"leaf_modules=\['gate'\]"):
        trace(_ShapeBranch(), torch.randn(2, 8), model_name="branchy")
    g = trace(_ShapeBranch(), torch.randn(2, 8), leaf_modules=["gate"])  # the fix the message names
    assert [(n.name, n.kind, n.selectable) for n in g.nodes] == [("a", "linear", True), ("gate", "leaf", False)]


def test_model_output_container_error_names_the_spec_field():
    net = T.BertForSequenceClassification(T.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                       num_attention_heads=2, intermediate_size=32))
    with pytest.raises(ModelError, match=r"returns a SequenceClassifierOutput \(keys 'logits'\).*model\.output: logits"):
        trace(net, torch.randint(0, 50, (1, 8)), model_name="bert")


@pytest.mark.slow
def test_train_two_ranks_on_pysource_reports_test_perplexity(solved, tmp_path, monkeypatch):
    """The launcher end to end: a transformers Llama from beside the spec, both groups' plans applied
    in their own rank processes, three synchronous steps on real text, the test set evaluated."""
    import csv

    from qsync_opt.training.runtime.launch import run_job

    spec = write_spec(tmp_path / "job", "llama", "hf_factories_run",
                      data={"name": "pysource", "kwargs": {"train_bytes": 20_000, "test_bytes": 2_000}})
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    plan = solved["llama"][1]  # the same model and cluster; the data section does not change the plan
    result = run_job(str(spec), plan, metrics_dir=str(tmp_path / "m"), timeout_s=300)
    assert result.ok and result.steps_done == 3
    row = list(csv.DictReader(open(tmp_path / "m" / "eval.csv")))[-1]
    assert int(row["test_samples"]) == (2_000 // (SEQ + 1)) * SEQ
    loss, ppl = float(row["test_loss"]), float(row["test_perplexity"])
    assert 0 < loss < 10 and ppl == pytest.approx(torch.exp(torch.tensor(loss)).item(), rel=1e-4)


def test_run_does_not_profile_an_exported_model_and_says_why(solved, tmp_path, monkeypatch):
    import json

    from qsync_opt.errors import QSyncError
    from qsync_opt.training.predictor.profiler import profile_group
    from qsync_opt.training.run_stages import profile_stage
    from qsync_opt.training.spec import load_spec

    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path / "profiles"))
    spec = load_spec(solved["gpt2"][0])
    record = json.loads(open(profile_stage(spec, tmp_path, log=lambda s: None)).read())
    assert record["profiled"] == {} and set(record["skipped"]) == {"fast", "low"}
    assert all("captured with torch.export" in why and "roofline" in why for why in record["skipped"].values())
    with pytest.raises(QSyncError, match=r"cannot be profiled per operator.*use costs: roofline"):
        profile_group(spec, "fast", tmp_path / "p.json")


class _ScaledLinear(nn.Linear):
    """A Linear subclass with its own forward (as Falcon's FalconLinear): the runtime cannot swap it."""

    def forward(self, x):
        return (x @ self.weight.T) * 2.0


class _Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.plain = nn.Linear(8, 8)
        self.custom = _ScaledLinear(8, 8, bias=False)

    def forward(self, x):
        y = self.plain(x)
        return self.custom(y) if x.shape[0] > 1 else y  # a shape test: fx cannot follow it, torch.export can


def test_exported_subclass_with_its_own_forward_is_pinned_and_the_plan_says_why():
    from qsync_opt.models.export_trace import pinned_notes
    from qsync_opt.training.plan import fingerprint_mismatch, graph_fingerprint
    from qsync_opt.runtime.apply import module_fingerprint_ops

    net = _Mixed()
    g = trace(net, torch.randn(2, 8))
    assert [n.name for n in g.selectable] == ["plain"]
    mm = g.node("custom.matmul_0")
    assert mm.kind == "matmul" and not mm.selectable and mm.fwd_flops == 2 * 2 * 8 * 8
    assert fingerprint_mismatch(graph_fingerprint(g), module_fingerprint_ops(net)) is None
    assert any("custom.matmul_0" in n and "subclass with its own forward" in n for n in pinned_notes(g))
