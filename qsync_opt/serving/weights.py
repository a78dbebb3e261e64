"""Which weights a serving run serves: a `transformers` causal LM of the spec's shape, random or loaded.

The shape is `serving.model`, the same fields the planner prices, so the plan and what runs cannot
disagree: `serving.runtime.family` picks the transformers class (Llama, OPT, BLOOM) and checks the
shape is one that family has. `serving.runtime.checkpoint` loads weights from a training run's
output folder (its newest valid checkpoint), a checkpoints folder, a `state.pt`, or a Hugging Face
model folder (`config.json` + weights, read with `from_pretrained`); weights whose architecture
differs from `serving.model` are refused naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qsync_opt.errors import SpecError
from qsync_opt.llm.config import TransformerConfig

CLASSES = {"llama": ("LlamaForCausalLM", "LlamaConfig"), "opt": ("OPTForCausalLM", "OPTConfig"),
           "bloom": ("BloomForCausalLM", "BloomConfig")}


@dataclass(frozen=True)
class ModelSource:
    """Everything a stage process needs to build the same model (picklable)."""
    family: str
    config: dict
    """transformers config fields."""
    checkpoint: str | None
    seed: int


def family_config(cfg: TransformerConfig, family: str) -> dict:
    """transformers config fields for `family` from the planner's shape; SpecError naming the field the
    family cannot have."""
    g = cfg.get
    need = {"llama": 3, "opt": 2, "bloom": 2}[family]
    if g("ffn_matrices") != need:
        raise SpecError(f"serving.model.ffn_matrices: {g('ffn_matrices')} but a {family} MLP has {need} matrices; "
                        f"set ffn_matrices: {need} or pick the family that has {g('ffn_matrices')}")
    if family == "llama":
        return {"hidden_size": g("hidden"), "num_hidden_layers": g("layers"), "num_attention_heads": g("heads"),
                    "num_key_value_heads": g("kv_heads"), "intermediate_size": g("ffn"), "vocab_size": g("vocab"),
                    "max_position_embeddings": g("max_positions"), "tie_word_embeddings": bool(g("tied_embeddings"))}
    if g("kv_heads") != g("heads"):
        raise SpecError(f"serving.model.kv_heads: {g('kv_heads')} but {family} has no grouped-query attention; "
                        f"set kv_heads: {g('heads')} (= heads)")
    if family == "opt":
        if not g("learned_positions"):
            raise SpecError("serving.model.learned_positions: false but OPT has a learned position table; "
                            "set learned_positions: true")
        return {"hidden_size": g("hidden"), "num_hidden_layers": g("layers"), "num_attention_heads": g("heads"),
                    "ffn_dim": g("ffn"), "vocab_size": g("vocab"), "max_position_embeddings": g("max_positions"),
                    "word_embed_proj_dim": g("hidden"), "tie_word_embeddings": bool(g("tied_embeddings"))}
    if g("ffn") != 4 * g("hidden"):
        raise SpecError(f"serving.model.ffn: {g('ffn')} but BLOOM's MLP is 4 x hidden = {4 * g('hidden')}; "
                        f"set ffn: {4 * g('hidden')}")
    return {"hidden_size": g("hidden"), "n_layer": g("layers"), "n_head": g("heads"), "vocab_size": g("vocab"),
                "tie_word_embeddings": bool(g("tied_embeddings"))}


def require_transformers(what: str = "serving.runtime.family") -> None:
    """SpecError (exit 2) naming `what` and the extra to install when transformers is missing: checked in the
    launching process, before any stage or profiling process would fail on it."""
    from qsync_opt.models.zoo_hf import need_transformers  # import cost: transformers (found, not imported twice)

    need_transformers(what)


def state_file(path: str) -> Path | None:
    """The state.pt a checkpoint path means, or None for a Hugging Face model folder."""
    p = Path(path)
    if p.is_file():
        return p
    if (p / "config.json").exists():
        return None
    from qsync_opt.runtime import checkpoint as ckpt  # import cost: torch
    for root in (p / "checkpoints", p):
        if root.is_dir() and ckpt.latest(root) is not None:
            return ckpt.require(root).path / "state.pt"
    raise SpecError(f"serving.runtime.checkpoint: {path!r} is not a state.pt, a checkpoints folder with a valid "
                    "checkpoint, a training run's output folder or a Hugging Face model folder (config.json); "
                    "point it at one, or omit it for random weights")


def build(source: ModelSource):
    """The model (eval mode, fp32), with the checkpoint's weights when one is given."""
    import torch  # import cost: torch

    from qsync_opt.models.zoo_hf import need_transformers  # import cost: transformers
    T = need_transformers("serving.runtime.family")
    model_cls, config_cls = CLASSES[source.family]
    field = "serving.runtime.checkpoint"
    if source.checkpoint is not None and state_file(source.checkpoint) is None:
        model = getattr(T, model_cls).from_pretrained(source.checkpoint, torch_dtype=torch.float32)
        got = model.config.to_dict()
        diff = {k: (got.get(k), v) for k, v in source.config.items()
                if k != "tie_word_embeddings" and got.get(k) != v}
        if diff:
            k, (have, want) = next(iter(diff.items()))
            raise SpecError(f"{field}: {source.checkpoint!r} has {k} = {have} but serving.model gives {want}; "
                            "make serving.model match the checkpoint's config.json")
        return model.eval()
    torch.manual_seed(source.seed)
    cfg = getattr(T, config_cls)(**source.config)
    model = getattr(T, model_cls)(cfg)
    if source.checkpoint is not None:
        path = state_file(source.checkpoint)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
            raise SpecError(f"{field}: {str(path)!r} cannot be read ({type(e).__name__}: {e})") from None
        state = state.get("model", state) if isinstance(state, dict) else state
        want = model.state_dict()
        for k, v in want.items():
            if k not in state and not k.endswith("lm_head.weight"):
                raise SpecError(f"{field}: {str(path)!r} has no {k!r}: it is not a {source.family} model of this "
                                "shape; make serving.model and serving.runtime.family match the checkpoint")
            if k in state and tuple(state[k].shape) != tuple(v.shape):
                raise SpecError(f"{field}: {str(path)!r} has {k} of shape {tuple(state[k].shape)} but serving.model "
                                f"gives {tuple(v.shape)}; make serving.model match the checkpoint's architecture")
        extra = [k for k in state if k not in want]
        if extra:
            raise SpecError(f"{field}: {str(path)!r} has weights this model lacks ({extra[0]!r}, {len(extra)} in all); "
                            "make serving.model (layers, ...) match the checkpoint's architecture")
        model.load_state_dict(state, strict=False)
        if cfg.tie_word_embeddings:
            model.tie_weights()
    return model.eval()
