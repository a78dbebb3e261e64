"""The serving pipeline (serving/pipeline.py, serve.py): one process per stage gives the same greedy tokens as
one process running the same quantised stages with the same micro-batches, token for token."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("transformers")

from qsync_opt.errors import SpecError
from qsync_opt.serving import lm, serve
from qsync_opt.serving.plan import Stage
from qsync_opt.serving.planner import plan_serving
from qsync_opt.serving.spec import load_serving_spec
from qsync_opt.serving.weights import build
from qsync_opt.solver.budget import Budget

pytestmark = pytest.mark.timeout(300)


def job(stages: int, **runtime):
    return load_serving_spec({
        "kind": "serving", "name": f"pipe{stages}",
        "cluster": {"groups": [{"name": "cpu", "device": "cpu-local", "count": stages}], "interconnect": "loopback"},
        "serving": {"model": {"layers": 4, "hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "vocab": 256,
                              "max_positions": 128, "ffn_matrices": 3, "tied_embeddings": False},
                    "prompt_len": 12, "gen_tokens": 6, "global_batch": 4, "bits": [4, 8, 16],
                    "micro_batches": {"prefill": [2], "decode": [1]},
                    "runtime": {"family": "llama", "requests": 8, **runtime}},
        "solver": {"time_limit_s": 10},
    })


def with_partition(plan, parts: list[tuple[int, int]], bits: list[int]):
    """The plan with its stages' layers and bits replaced (the pipeline serves whatever the plan says)."""
    stages = [Stage(**{**st.model_dump(), "layers": p, "bits": bits[p[0]:p[1]]}) for st, p in zip(plan.stages, parts)]
    return plan.model_copy(update={"stages": stages})


def reference(j, plan) -> torch.Tensor:
    """The same stages in this one process, batch after batch, with the stage processes' thread count."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // len(plan.stages)))
    model = build(serve.model_source(j))
    bits = [b for st in plan.stages for b in st.bits]
    stages = lm.cut(model, [tuple(st.layers) for st in plan.stages], bits)
    p = serve.prompts(j)
    B = j.serving.global_batch
    return torch.cat([lm.generate(stages, p[i:i + B], j.serving.gen_tokens, prefill_mb=plan.prefill_micro_batch,
                                  decode_mb=plan.decode_micro_batch) for i in range(0, p.shape[0], B)])


@pytest.mark.parametrize("n, parts, bits", [
    (2, [(0, 3), (3, 4)], [16, 8, 4, 8]),
    (3, [(0, 1), (1, 3), (3, 4)], [4, 16, 8, 16]),
])
def test_pipeline_tokens_equal_a_single_process_run(tmp_path, n, parts, bits):
    j = job(n)
    plan = with_partition(plan_serving(j, Budget(10)), parts, bits)
    served = serve.run_pipeline(j, plan, tmp_path / "pipe")
    assert served["tokens"].shape == (8, 6)
    assert torch.equal(served["tokens"], reference(j, plan))
    m = serve.measure(j, plan, served)
    assert m["requests"] == 8 and m["batches"] == 2 and m["tokens_per_s"] > 0
    assert [s["layers"] for s in m["stages"]] == [list(p) for p in parts]
    for s in m["stages"]:  # every stage ran every micro-batch of every phase: busy within the span
        assert 0 < s["busy_s"] <= m["span_s"] + 1e-6


def test_a_plan_from_another_spec_is_refused_naming_it(tmp_path):
    plan = plan_serving(job(2), Budget(10))
    other = job(2, seed=0).model_copy(update={"name": "other"})
    with pytest.raises(SpecError, match="plan: made from another spec"):
        serve.write_pipeline(other, plan, tmp_path / "pipe")


def test_a_checkpoint_of_another_architecture_is_exit_2_naming_the_field(tmp_path):
    import transformers as T

    small = T.LlamaForCausalLM(T.LlamaConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=64, vocab_size=256))
    torch.save({"model": small.state_dict()}, tmp_path / "state.pt")
    j = job(2, checkpoint=str(tmp_path / "state.pt"))
    with pytest.raises(SpecError, match=r"serving.runtime.checkpoint: .* has model.embed_tokens.weight of shape \(256, 32\)"):
        build(serve.model_source(j))
    with pytest.raises(SpecError, match="serving.runtime.checkpoint: .* is not a state.pt"):
        serve.model_source(job(2, checkpoint=str(tmp_path / "nothing")))


def test_requests_not_a_multiple_of_the_batch_name_the_field():
    with pytest.raises(SpecError, match="runtime.requests: 6 is not a multiple of global_batch 4"):
        job(2, requests=6)


def test_without_transformers_run_is_exit_2_naming_the_field_before_any_process(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(SpecError, match="serving.runtime.family needs the 'transformers' package.*qsync-opt\\[hf\\]"):
        serve.model_source(job(2))
