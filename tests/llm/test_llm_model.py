"""The shared LLM cost model: its configs and presets, and the phase costs serving and rollout both call."""

import pytest
from pydantic import ValidationError

from qsync_opt.hardware.device import find_device
from qsync_opt.llm import costs as C
from qsync_opt.llm.config import PRESETS, TransformerConfig
from qsync_opt.rollout.spec import RolloutSection
from qsync_opt.serving.spec import ServingSpec


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_complete_model(name):
    cfg = TransformerConfig(preset=name)
    assert cfg.get("hidden") == cfg.head_dim * cfg.get("heads")
    assert cfg.get("heads") % cfg.get("kv_heads") == 0
    assert cfg.label == name


def test_an_unknown_preset_names_the_known_ones():
    with pytest.raises(ValidationError, match="unknown preset 'gpt-5'.*llama-3-8b"):
        TransformerConfig(preset="gpt-5")


def test_a_field_overrides_its_preset():
    assert TransformerConfig(preset="llama-3-8b", layers=2).get("layers") == 2
    assert TransformerConfig(preset="llama-3-8b").get("layers") == PRESETS["llama-3-8b"]["layers"]


def test_serving_and_rollout_read_the_same_model_type():
    """One model, not a copy: both kinds' specs take the shared config."""
    assert ServingSpec.model_fields["model"].annotation is TransformerConfig
    assert RolloutSection.model_fields["model"].annotation is TransformerConfig


def test_a_ragged_prefill_of_equal_lengths_prices_as_the_equal_one():
    cfg, dev = TransformerConfig(preset="llama-2-7b"), find_device("A100-40GB")
    w = C.Workload(prompt_len=512, gen_tokens=0, global_batch=4)
    for bits in (4, 16):
        assert C.prefill_layer_ms_lengths(cfg, dev, bits, 4 * 512, 4 * 512 ** 2) == pytest.approx(
            C.prefill_layer_ms(cfg, w, dev, bits, 4))
