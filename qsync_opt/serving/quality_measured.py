"""Quality, measured: the served model's perplexity for a plan's bit-widths, and the statistics Σω reads.

The planner keeps quality with a proxy, LLM-PQ's Σω (`serving.quality`). This module measures what
the proxy stands for, on the same quantised stages the runtime serves (`serving.lm`):

* `plan_perplexities(job, plan, hf_model)`: perplexity of the served model on held-out text for the
  plan's per-layer bits, every fitting baseline's, and the uniform 16-bit and uniform lowest-bit
  models, each beside its Σω under the job's indicator. The text is byte-level: the `pysource` test
  split (files no training run saw), or the file `serving.runtime.prompts` names; scored in
  `serving.runtime.perplexity_windows` non-overlapping windows of prompt_len + gen_tokens tokens.
* `calibration_stats(hf_model, tokens, window)`: the `serving.quality.stats` document the planner
  reads for a calibrated LLM-PQ Σω — per decoder layer, per linear, the weight's largest magnitude
  over its output channels (`range`: the symmetric quantiser's step is range / (2^(b−1) − 1)), the
  sum over input features of the variance of that linear's input on the calibration text
  (`x_var_sum`, population variance over every token), and whether it is an FFN linear.
* `empirical_indicator(hf_model, bits, tokens, window)`: the `serving.quality.indicator: empirical`
  document — per layer and bit-width, the perplexity increase over the all-16-bit served model when
  that layer alone is quantised (the others at 16 bits), as the training kind's empirical indicator
  measures each operator alone.

Perplexity is exp(mean next-token cross-entropy) over every position of every window (`lm.perplexity`).
The 16-bit layers store bf16 weights (`lm.QLinear`), so the all-16 model equals the checkpoint with
its linears' weights rounded to bf16, not the fp32 checkpoint itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from qsync_opt.data import text
from qsync_opt.errors import SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.serving import lm
from qsync_opt.serving.plan import ServingPlan
from qsync_opt.serving.quality import layer_omegas
from qsync_opt.serving.spec import ServingJob

DEFAULT_CALIBRATION_WINDOWS = 32
"""Windows of training text `calibration_stats` reads when the caller gives none."""


@dataclass(frozen=True)
class QualityRecord:
    """One policy's served quality."""
    policy: str
    """'plan', a baseline's name, 'all-16' or 'all-<lowest>'."""
    bits: tuple[int, ...]
    """Bit-width of each decoder layer, in order."""
    sigma_omega: float
    """Σω of these bits under the job's indicator (what the planner bounded)."""
    perplexity: float
    """Of the served (quantised) model on the held-out text."""


# --------------------------------------------------------------------------------------- text


def text_tokens(job: ServingJob, windows: int | None = None, split: str = "test") -> torch.Tensor:
    """1-D int64 byte ids holding `windows` windows of prompt_len + gen_tokens tokens (+1 for the last target):
    the `pysource` split named, or the text file `serving.runtime.prompts` names. SpecError naming the field
    when the model's vocabulary cannot hold bytes or the text is too short."""
    s = job.serving
    window = s.prompt_len + s.gen_tokens
    n = s.runtime.perplexity_windows if windows is None else windows
    if n < 1:
        raise SpecError("serving.runtime.perplexity_windows: 0 scores no text; give at least 1 window")
    if s.model.get("vocab") < text.VOCAB:
        raise SpecError(f"serving.model.vocab: {s.model.get('vocab')} cannot hold byte-level text (256 ids); perplexity "
                        "is measured on bytes: give vocab ≥ 256")
    need = n * window + 1
    src = s.runtime.prompts
    if src in ("pysource", "random"):
        files = [f for f in text.stdlib_files() if text.is_test_file(f.name) == (split == "test")]
        blob = text.read_files(files, need)
        where = f"the pysource {split} split"
    else:
        p = Path(src)
        if not p.is_file():
            raise SpecError(f"serving.runtime.prompts: {src!r} is not a file; give a text file, 'pysource' or 'random'")
        blob = p.read_bytes()[:need]
        where = src
    if len(blob) < need:
        raise SpecError(f"serving.runtime.perplexity_windows: {n} windows of {window} tokens need {need} bytes but "
                        f"{where} has {len(blob)}; lower perplexity_windows")
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(torch.int64)


def compute_dtype(job: ServingJob, device: torch.device | str = "cpu") -> torch.dtype:
    """serving.runtime.dtype as a torch dtype ('auto': float16 on CUDA, float32 elsewhere)."""
    d = job.serving.runtime.dtype
    if d == "auto":
        return torch.float16 if torch.device(device).type == "cuda" else torch.float32
    return getattr(torch, d)


# --------------------------------------------------------------------------------------- perplexity


def bits_perplexity(hf_model: nn.Module, bits: list[int], tokens: torch.Tensor, window: int, *,
                    windows: int | None = None, partition: list[tuple[int, int]] | None = None,
                    dtype: torch.dtype = torch.float32, group: int = lm.DEFAULT_GROUP) -> float:
    """Perplexity of the served model with layer i at bits[i] (one stage, or `partition`'s stages: the same
    logits either way) over `windows` windows of `window` tokens of `tokens`."""
    part = partition or [(0, len(bits))]
    tokens = tokens.to(next(hf_model.parameters()).device)
    return lm.perplexity(lm.cut(hf_model, part, list(bits), dtype=dtype, group=group), tokens, window, windows)


@torch.inference_mode()
def model_perplexity(hf_model: nn.Module, tokens: torch.Tensor, window: int, windows: int | None = None) -> float:
    """Perplexity of the transformers model's own forward over the same windows as `lm.perplexity` (the reference
    the served all-16 model is compared with)."""
    tokens = tokens.to(next(hf_model.parameters()).device)
    n = (tokens.numel() - 1) // window
    n = min(n, windows) if windows is not None else n
    x = tokens[: n * window].view(n, window)
    y = tokens[1: n * window + 1].view(n, window)
    nll = 0.0
    for rows in lm.micro_slices(n, 8):
        logits = hf_model(x[rows]).logits.float()
        nll += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[rows].reshape(-1),
                                                 reduction="sum").item()
    return math.exp(nll / y.numel())


def _layer_bits(stages) -> tuple[list[int], list[tuple[int, int]]]:
    bits, part = [], []
    for st in stages:
        bits += list(st.bits)
        part.append(tuple(st.layers))
    return bits, part


def plan_perplexities(job: ServingJob, plan: ServingPlan, hf_model: nn.Module, tokens: torch.Tensor | None = None) -> list[QualityRecord]:
    """The served model's perplexity for the plan's bits, each fitting baseline's, all 16-bit and all at the
    lowest offered bit-width, each with its Σω under the job's indicator (`serving.quality`). `tokens`
    defaults to `text_tokens(job)`; windows are prompt_len + gen_tokens tokens, perplexity_windows of them."""
    s = job.serving
    window = s.prompt_len + s.gen_tokens
    tokens = text_tokens(job) if tokens is None else tokens
    windows = max(1, (tokens.numel() - 1) // window)
    omega, _ = layer_omegas(s.model, list(s.bits), s.quality.stats, s.quality.indicator)
    layers = s.model.get("layers")
    if lm.shape_of(hf_model).layers != layers:
        raise SpecError(f"serving.model.layers: {layers} but the model served has {lm.shape_of(hf_model).layers} "
                        "decoder layers; make serving.model match the weights")
    dtype = compute_dtype(job, next(hf_model.parameters()).device)
    policies = [("plan", *_layer_bits(plan.stages))]
    policies += [(b.name, *_layer_bits(b.stages)) for b in plan.baselines if b.fits and b.stages]
    for b in sorted({16, min(s.bits)}, reverse=True):
        policies.append((f"all-{b}", [b] * layers, None))
    out, seen = [], {}
    for name, bits, part in policies:
        key = tuple(bits)
        if key not in seen:  # the same bits give the same logits whatever the partition
            seen[key] = bits_perplexity(hf_model, bits, tokens, window, windows=windows, partition=part, dtype=dtype,
                                        group=s.runtime.group_size)
        out.append(QualityRecord(name, key, sum(omega[i][b] for i, b in enumerate(bits)), seen[key]))
    return out


# --------------------------------------------------------------------------------------- calibration statistics


@torch.inference_mode()
def calibration_stats(hf_model: nn.Module, tokens: torch.Tensor, window: int, windows: int | None = None) -> dict:
    """The LLM-PQ statistics document (module docstring) of `hf_model` on `windows` windows of `window` tokens
    of `tokens`, computed with the unquantised model's own forward."""
    fam = lm.family_of(hf_model)
    tokens = tokens.to(next(hf_model.parameters()).device)
    n = (tokens.numel() - 1) // window
    n = min(n, windows) if windows is not None else n
    if n < 1:
        raise ValueError(f"{tokens.numel()} tokens make no window of {window} + 1")
    x = tokens[: n * window].view(n, window)
    layers = lm.decoder_layers(hf_model)
    sums: dict[tuple[int, str], list] = {}
    hooks = []
    for i, layer in enumerate(layers):
        for path, lin in lm.layer_linears(layer, fam).items():
            acc = sums.setdefault((i, path), [0, None, None])  # count, Σx, Σx² per input feature (float64)

            def hook(_m, args, _out, acc=acc):
                a = args[0].detach().reshape(-1, args[0].shape[-1]).double()
                acc[0] += a.shape[0]
                acc[1] = a.sum(0) if acc[1] is None else acc[1] + a.sum(0)
                acc[2] = (a * a).sum(0) if acc[2] is None else acc[2] + (a * a).sum(0)

            hooks.append(lin.register_forward_hook(hook))
    try:
        for rows in lm.micro_slices(n, 8):
            hf_model(x[rows])
    finally:
        for h in hooks:
            h.remove()
    doc_layers = []
    for i, layer in enumerate(layers):
        lins = []
        for path, lin in lm.layer_linears(layer, fam).items():
            count, s1, s2 = sums[(i, path)]
            mean = s1 / count
            var = (s2 / count - mean * mean).clamp_min(0.0)
            lins.append({"name": path, "range": float(lin.weight.detach().abs().max()), "x_var_sum": float(var.sum()),
                         "ffn": is_ffn(path)})
        doc_layers.append({"linears": lins})
    return {"indicator": "llm-pq", "family": fam, "calibration_tokens": int(n * window), "layers": doc_layers}


def is_ffn(path: str) -> bool:
    """Whether a linear (by its path in the decoder layer, `lm.layer_linears`) belongs to the MLP."""
    return path.startswith("mlp.") or path in ("fc1", "fc2")


# --------------------------------------------------------------------------------------- empirical indicator


def empirical_indicator(hf_model: nn.Module, bits: list[int], tokens: torch.Tensor, window: int, *,
                        windows: int | None = None, dtype: torch.dtype = torch.float32,
                        group: int = lm.DEFAULT_GROUP) -> dict:
    """The empirical indicator document: per layer and bit-width in `bits`, the served perplexity with that
    layer alone at that width (the others at 16) minus the all-16 served perplexity (16 bits included:
    measured, it is the reference itself)."""
    layers = lm.shape_of(hf_model).layers
    ref = bits_perplexity(hf_model, [16] * layers, tokens, window, windows=windows, dtype=dtype, group=group)
    doc_layers = []
    for i in range(layers):
        om = {}
        for b in sorted(bits):
            one = [16] * layers
            one[i] = b
            om[int(b)] = bits_perplexity(hf_model, one, tokens, window, windows=windows, dtype=dtype, group=group) - ref
        doc_layers.append({"omega": om})
    n = (tokens.numel() - 1) // window
    return {"indicator": "empirical", "metric": "perplexity increase over the all-16-bit served model",
            "reference_perplexity": ref, "window": window, "windows": min(n, windows) if windows else n,
            "layers": doc_layers}


def write_stats(doc: dict, path: str | Path) -> Path:
    """Write a statistics document (`calibration_stats` or `empirical_indicator`) for serving.quality.stats."""
    return atomic_write_text(Path(path), yaml.safe_dump(doc, sort_keys=False))


def write_empirical(job: ServingJob, hf_model: nn.Module, path: str | Path, tokens: torch.Tensor | None = None) -> Path:
    """Measure the empirical indicator of `hf_model` for the job's bit-widths on `tokens` (default: perplexity_windows
    windows of the pysource training split, so the indicator is not fitted to the text perplexity is scored on) and
    write it to `path`, for serving.quality.indicator: empirical."""
    s = job.serving
    tokens = text_tokens(job, split="train") if tokens is None else tokens
    doc = empirical_indicator(hf_model, list(s.bits), tokens, s.prompt_len + s.gen_tokens,
                              dtype=compute_dtype(job, next(hf_model.parameters()).device), group=s.runtime.group_size)
    return write_stats(doc, path)
