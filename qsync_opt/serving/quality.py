"""LLM-PQ's quality indicator per decoder layer and weight bit-width.

For a linear layer quantised to b bits with step s_w = (max channel range) / (2^(b−1) − 1),
the output perturbation grows as s_w² · Σ Var[x] over its input features; a layer's ω(b)
sums this over its linears, FFN terms weighted ×4 (LLM-PQ, PPoPP'24). 16 bits (FP16) is the
reference: ω = 0.

With calibration statistics (`serving.quality.stats`) each layer gets its own ω. Without
them the indicator is data-free: unit weight range and unit-variance inputs per feature (what
LayerNorm hands the first linears), so every layer has the same ω(b) and only the bit-width
and the layer's shape matter. The plan names which one was used.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from qsync_opt.errors import SpecError
from qsync_opt.llm.config import TransformerConfig

FFN_WEIGHT = 4.0


def step(bits: int, value_range: float = 1.0) -> float:
    return 0.0 if bits >= 16 else value_range / (2 ** (bits - 1) - 1)


def data_free_omega(cfg: TransformerConfig, bits: list[int]) -> dict[int, float]:
    """ω(b) of one layer with unit weight range and Σ Var[x] = input width (same for every layer)."""
    h, f, kv = cfg.get("hidden"), cfg.get("ffn"), cfg.get("kv_heads") * cfg.head_dim
    # (input width, count, is_ffn): Q, K, V and O read h features; FFN up (and gate) read h, down reads f.
    linears = [(h, 2, False), (h, 2 * kv / h, False), (h, cfg.get("ffn_matrices") - 1, True), (f, 1, True)]
    return {b: sum(d * n * step(b) ** 2 * (FFN_WEIGHT if ffn else 1.0) for d, n, ffn in linears) for b in bits}


def omega_from_stats(path: str, cfg: TransformerConfig, bits: list[int]) -> list[dict[int, float]]:
    """Per-layer ω from a stats file: {layers: [{linears: [{range, x_var_sum, ffn}]}]}."""
    p = Path(path)
    if not p.exists():
        raise SpecError(f"serving.quality.stats: file {path!r} does not exist; give calibration statistics or omit the field")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise SpecError(f"serving.quality.stats: {path!r} is not valid YAML/JSON: {e}") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list) or len(layers) != cfg.get("layers"):
        got = len(layers) if isinstance(layers, list) else "none"
        raise SpecError(f"serving.quality.stats: needs 'layers' with one entry per decoder layer ({cfg.get('layers')}), got {got}")
    out = []
    for i, layer in enumerate(layers):
        lins = layer.get("linears") if isinstance(layer, dict) else None
        if not isinstance(lins, list) or not lins:
            raise SpecError(f"serving.quality.stats: layers[{i}] needs a non-empty 'linears' list")
        om = {}
        for b in bits:
            total = 0.0
            for k, lin in enumerate(lins):
                try:
                    r, var = float(lin["range"]), float(lin["x_var_sum"])
                except (KeyError, TypeError, ValueError):
                    raise SpecError(
                        f"serving.quality.stats: layers[{i}].linears[{k}] needs numbers 'range' and 'x_var_sum', got {lin!r}"
                    ) from None
                if r < 0 or var < 0:
                    raise SpecError(f"serving.quality.stats: layers[{i}].linears[{k}]: range and x_var_sum must be ≥ 0")
                total += step(b, r) ** 2 * var * (FFN_WEIGHT if lin.get("ffn") else 1.0)
            om[b] = total
        out.append(om)
    return out


def layer_omegas(cfg: TransformerConfig, bits: list[int], stats: str | None) -> tuple[list[dict[int, float]], str]:
    """(ω per layer per bit, a sentence saying where it came from)."""
    if stats:
        return omega_from_stats(stats, cfg, bits), f"LLM-PQ indicator from calibration statistics {stats}"
    om = data_free_omega(cfg, bits)
    return [dict(om) for _ in range(cfg.get("layers"))], (
        "LLM-PQ indicator, data-free: unit weight range and unit-variance inputs, identical for every layer "
        "(give serving.quality.stats for calibrated per-layer values)"
    )
