"""The serving runtime's model (serving/lm.py): the same logits as transformers' own forward, the same
greedy tokens with its KV cache and any micro-batching, and quantised weights within their step."""

from __future__ import annotations

import pytest
import torch

T = pytest.importorskip("transformers")

from qsync_opt.serving import lm


def tiny(family: str, layers: int = 3):
    torch.manual_seed(0)
    if family == "llama":
        cfg = T.LlamaConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=128, vocab_size=256, max_position_embeddings=128)
        model = T.LlamaForCausalLM(cfg)
    elif family == "opt":
        cfg = T.OPTConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, ffn_dim=128, vocab_size=256,
                          max_position_embeddings=128, word_embed_proj_dim=64)
        model = T.OPTForCausalLM(cfg)
    else:
        model = T.BloomForCausalLM(T.BloomConfig(hidden_size=64, n_layer=layers, n_head=4, vocab_size=256))
    model = model.eval()
    with torch.no_grad():  # 16-bit layers store bf16 weights: compare with the model rounded the same way
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


@pytest.mark.parametrize("family", ["llama", "opt", "bloom"])
def test_stages_give_transformers_logits(family):
    model = tiny(family)
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    ref = model(ids).logits.float()
    got = lm.sequence_logits(lm.cut(model, [(0, 2), (2, 3)], [16, 16, 16]), ids)
    assert (got - ref).abs().max().item() < 1e-4 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("family", ["llama", "opt", "bloom"])
def test_cached_greedy_decoding_equals_recomputing_the_whole_sequence(family):
    model = tiny(family)
    stages = lm.cut(model, [(0, 1), (1, 3)], [8, 4, 16])
    prompts = torch.randint(0, 256, (4, 12), generator=torch.Generator().manual_seed(2))
    out = lm.generate(stages, prompts, 6, prefill_mb=2, decode_mb=4)
    seq = prompts
    for step in range(6):  # no cache: the whole sequence every step
        nxt = lm.sequence_logits(stages, seq)[:, -1].argmax(-1)
        assert torch.equal(nxt, out[:, step])
        seq = torch.cat([seq, nxt[:, None]], dim=1)


def test_micro_batching_does_not_change_tokens():
    model = tiny("llama")
    stages = lm.cut(model, [(0, 3)], [16, 8, 4])
    prompts = torch.randint(0, 256, (4, 10), generator=torch.Generator().manual_seed(3))
    a = lm.generate(stages, prompts, 5, prefill_mb=4, decode_mb=4)
    b = lm.generate(stages, prompts, 5, prefill_mb=1, decode_mb=2)
    assert torch.equal(a, b)


@pytest.mark.parametrize("bits", [8, 4, 3, 2])
def test_quantised_weight_within_half_a_step_and_stored_at_its_width(bits):
    torch.manual_seed(4)
    lin = torch.nn.Linear(128, 32)
    q = lm.QLinear(lin, bits, torch.float32, group=64)
    w = lin.weight.detach()
    step = w.view(32, 2, 64).abs().amax(-1, keepdim=True) / (2 ** (bits - 1) - 1)
    err = (q.dequantized() - w).view(32, 2, 64).abs()
    assert (err <= step / 2 + 1e-6).all()
    per_weight = q.codes.numel() * q.codes.element_size() / w.numel()
    assert per_weight == (1.0 if bits == 8 else 0.5)
    x = torch.randn(3, 128)
    assert torch.allclose(q(x), torch.nn.functional.linear(x, q.dequantized(), lin.bias), atol=1e-6)


def test_stage_refuses_a_partition_outside_the_model():
    with pytest.raises(ValueError, match="do not fit a 3-layer model"):
        lm.Stage(tiny("llama"), 2, 4, [16, 16])
