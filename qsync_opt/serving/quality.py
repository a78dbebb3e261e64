"""LLM-PQ's quality indicator per decoder layer and weight bit-width.

For a linear layer quantised to b bits with step s_w = (max channel range) / (2^(b−1) − 1),
the output perturbation grows as s_w² · Σ Var[x] over its input features; a layer's ω(b)
sums this over its linears, FFN terms weighted ×4 (LLM-PQ, PPoPP'24). 16 bits (FP16) is the
reference: ω = 0.

With calibration statistics (`serving.quality.stats`) each layer gets its own ω. Without
them the indicator is data-free: unit weight range and unit-variance inputs per feature (what
LayerNorm hands the first linears), so every layer has the same ω(b) and only the bit-width
and the layer's shape matter. The plan names which one was used.

`serving.quality.indicator: empirical` replaces the proxy by a measurement: `stats` then names a
file `qsync_opt.serving.quality_measured.write_empirical` wrote, holding per layer and bit-width
the perplexity increase over the all-16-bit model when that layer alone is quantised (as the
training kind's empirical indicator measures each operator alone). Σω is then the sum of those
increases (negative ones, noise, count as 0).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from qsync_opt.errors import SpecError
from qsync_opt.llm.config import TransformerConfig

FFN_WEIGHT = 4.0
INDICATORS = ("llm-pq", "empirical")
"""Values of serving.quality.indicator: LLM-PQ's Σω proxy, or measured per-layer perplexity increase."""


def step(bits: int, value_range: float = 1.0) -> float:
    return 0.0 if bits >= 16 else value_range / (2 ** (bits - 1) - 1)


def data_free_omega(cfg: TransformerConfig, bits: list[int]) -> dict[int, float]:
    """ω(b) of one layer with unit weight range and Σ Var[x] = input width (same for every layer)."""
    h, f, kv = cfg.get("hidden"), cfg.get("ffn"), cfg.get("kv_heads") * cfg.head_dim
    # (input width, count, is_ffn): Q, K, V and O read h features; FFN up (and gate) read h, down reads f.
    linears = [(h, 2, False), (h, 2 * kv / h, False), (h, cfg.get("ffn_matrices") - 1, True), (f, 1, True)]
    return {b: sum(d * n * step(b) ** 2 * (FFN_WEIGHT if ffn else 1.0) for d, n, ffn in linears) for b in bits}


def read_layers(path: str, cfg: TransformerConfig, indicator: str) -> list:
    """The 'layers' list of a stats file, one entry per decoder layer; SpecError naming serving.quality.stats
    (or .indicator, when the file holds the other indicator's data)."""
    p = Path(path)
    if not p.exists():
        raise SpecError(f"serving.quality.stats: file {path!r} does not exist; give calibration statistics or omit the field")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise SpecError(f"serving.quality.stats: {path!r} is not valid YAML/JSON: {e}") from None
    held = (data.get("indicator") or "llm-pq") if isinstance(data, dict) else "llm-pq"
    if held != indicator:
        raise SpecError(f"serving.quality.indicator: {indicator!r} but {path!r} holds the {held!r} indicator's data; "
                        f"set serving.quality.indicator: {held}, or point serving.quality.stats at a {indicator} file")
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list) or len(layers) != cfg.get("layers"):
        got = len(layers) if isinstance(layers, list) else "none"
        raise SpecError(f"serving.quality.stats: needs 'layers' with one entry per decoder layer ({cfg.get('layers')}), got {got}")
    return layers


def omega_from_stats(path: str, cfg: TransformerConfig, bits: list[int]) -> list[dict[int, float]]:
    """Per-layer ω from a stats file: {layers: [{linears: [{range, x_var_sum, ffn}]}]}."""
    layers = read_layers(path, cfg, "llm-pq")
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


def omega_empirical(path: str, cfg: TransformerConfig, bits: list[int]) -> list[dict[int, float]]:
    """Per-layer ω from an empirical file: {indicator: empirical, layers: [{omega: {bits: perplexity increase}}]};
    a negative increase (measurement noise) counts as 0, 16 bits as 0 when the file omits it."""
    layers = read_layers(path, cfg, "empirical")
    out = []
    for i, layer in enumerate(layers):
        om = layer.get("omega") if isinstance(layer, dict) else None
        if not isinstance(om, dict):
            raise SpecError(f"serving.quality.stats: layers[{i}] needs an 'omega' map of bit-width to perplexity increase")
        row = {}
        for b in bits:
            v = om.get(b, om.get(str(b), 0.0 if b >= 16 else None))
            if v is None:
                raise SpecError(f"serving.quality.stats: layers[{i}].omega has no {b}-bit value (serving.bits offers {b}); "
                                f"measure it (write_empirical with bits {list(bits)}) or drop {b} from serving.bits")
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise SpecError(f"serving.quality.stats: layers[{i}].omega[{b}] must be a number, got {v!r}") from None
            if v != v:
                raise SpecError(f"serving.quality.stats: layers[{i}].omega[{b}] is NaN; measure it again")
            row[b] = max(0.0, v)
        out.append(row)
    return out


def layer_omegas(cfg: TransformerConfig, bits: list[int], stats: str | None,
                 indicator: str = "llm-pq") -> tuple[list[dict[int, float]], str]:
    """(ω per layer per bit, a sentence saying where it came from)."""
    if indicator == "empirical":
        if not stats:
            raise SpecError("serving.quality.stats: indicator 'empirical' needs the file of measured per-layer "
                            "perplexity increases (quality_measured.write_empirical); give it or use indicator: llm-pq")
        return omega_empirical(stats, cfg, bits), (
            f"empirical indicator: measured perplexity increase of each layer alone at each bit-width, from {stats}")
    if stats:
        return omega_from_stats(stats, cfg, bits), f"LLM-PQ indicator from calibration statistics {stats}"
    om = data_free_omega(cfg, bits)
    return [dict(om) for _ in range(cfg.get("layers"))], (
        "LLM-PQ indicator, data-free: unit weight range and unit-variance inputs, identical for every layer "
        "(give serving.quality.stats for calibrated per-layer values)"
    )
