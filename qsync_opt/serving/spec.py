"""The `serving:` section of a job spec: which LLM, which workload, which bits, which goal.

The model is a decoder-only transformer described by its config (no weights are needed to
plan); presets give the published configs of the models LLM-PQ (PPoPP'24) evaluates, and
any field may override a preset. Pipeline devices are the spec's `cluster.groups`, expanded
device by device in the order listed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal, Union

import yaml
from pydantic import Field, field_validator, model_validator

from qsync_opt.hardware.cluster import Cluster
from qsync_opt.solver.spec import SolverSpec
from qsync_opt.spec.base import SpecModel as _Model
from qsync_opt.spec.load import read_document, validate


#: Published configs (the models' config.json on their model cards).
PRESETS: dict[str, dict] = {
    "opt-13b": dict(layers=40, hidden=5120, ffn=20480, heads=40, kv_heads=40, vocab=50272, max_positions=2048,
                    ffn_matrices=2, tied_embeddings=True, learned_positions=True),
    "opt-30b": dict(layers=48, hidden=7168, ffn=28672, heads=56, kv_heads=56, vocab=50272, max_positions=2048,
                    ffn_matrices=2, tied_embeddings=True, learned_positions=True),
    "opt-66b": dict(layers=64, hidden=9216, ffn=36864, heads=72, kv_heads=72, vocab=50272, max_positions=2048,
                    ffn_matrices=2, tied_embeddings=True, learned_positions=True),
    "bloom-176b": dict(layers=70, hidden=14336, ffn=57344, heads=112, kv_heads=112, vocab=250880, max_positions=2048,
                       ffn_matrices=2, tied_embeddings=True, learned_positions=False),
    "llama-2-7b": dict(layers=32, hidden=4096, ffn=11008, heads=32, kv_heads=32, vocab=32000, max_positions=4096,
                       ffn_matrices=3, tied_embeddings=False, learned_positions=False),
    "llama-2-13b": dict(layers=40, hidden=5120, ffn=13824, heads=40, kv_heads=40, vocab=32000, max_positions=4096,
                        ffn_matrices=3, tied_embeddings=False, learned_positions=False),
    "llama-2-70b": dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=32000, max_positions=4096,
                        ffn_matrices=3, tied_embeddings=False, learned_positions=False),
    "llama-3-8b": dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256, max_positions=8192,
                       ffn_matrices=3, tied_embeddings=False, learned_positions=False),
    "llama-3-70b": dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256, max_positions=8192,
                        ffn_matrices=3, tied_embeddings=False, learned_positions=False),
}

BitWidth = Literal[2, 3, 4, 8, 16]


class TransformerConfig(_Model):
    """A decoder-only transformer: a preset name, and/or its shape fields (fields override the preset)."""

    preset: str | None = None
    """One of opt-13b, opt-30b, opt-66b, bloom-176b, llama-2-7b/13b/70b, llama-3-8b/70b."""
    layers: int | None = Field(default=None, ge=1)
    """Number of decoder layers."""
    hidden: int | None = Field(default=None, ge=1)
    """Hidden size h."""
    ffn: int | None = Field(default=None, ge=1)
    """FFN inner size."""
    heads: int | None = Field(default=None, ge=1)
    """Attention (query) heads."""
    kv_heads: int | None = Field(default=None, ge=1)
    """Key/value heads (fewer than heads for grouped-query attention); default: heads."""
    vocab: int | None = Field(default=None, ge=1)
    max_positions: int | None = Field(default=None, ge=1)
    """Longest context the model accepts (prompt + generated tokens must fit)."""
    ffn_matrices: Literal[2, 3] | None = None
    """2 for a plain MLP (OPT, BLOOM), 3 for a gated one (Llama's gate/up/down)."""
    tied_embeddings: bool | None = None
    """Whether the LM head shares the token embedding's weights."""
    learned_positions: bool | None = None
    """Whether there is a learned position-embedding table (OPT)."""

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v):
        if v is not None and v.lower() not in PRESETS:
            raise ValueError(f"unknown preset {v!r}; presets: {', '.join(PRESETS)}; or give the shape fields")
        return v.lower() if v else v

    @model_validator(mode="after")
    def _complete(self) -> "TransformerConfig":
        base = PRESETS.get(self.preset or "", {})
        missing = [k for k in ("layers", "hidden", "ffn", "heads", "vocab") if getattr(self, k) is None and k not in base]
        if missing:
            raise ValueError(f"model needs {missing} (or a preset: {', '.join(PRESETS)})")
        hidden, heads, kv_heads = self.get("hidden"), self.get("heads"), self.get("kv_heads")
        if hidden % heads:  # each head is hidden / heads wide: a fraction (or 0, heads > hidden) is no model
            raise ValueError(f"heads: {heads} does not divide hidden {hidden} (each head is hidden / heads wide); "
                             "give a divisor of hidden")
        if kv_heads > heads or heads % kv_heads:
            raise ValueError(f"kv_heads: {kv_heads} must divide heads {heads} (each key/value head serves "
                             "heads / kv_heads query heads)")
        return self

    def get(self, key: str):
        """The field, else the preset's value, else its default."""
        v = getattr(self, key)
        if v is not None:
            return v
        base = PRESETS.get(self.preset or "", {})
        if key in base:
            return base[key]
        defaults = {"kv_heads": self.get("heads"), "max_positions": 2048, "ffn_matrices": 2,
                    "tied_embeddings": True, "learned_positions": False}
        return defaults[key]

    @property
    def head_dim(self) -> int:
        return self.get("hidden") // self.get("heads")

    @property
    def label(self) -> str:
        return self.preset or f"custom-{self.get('layers')}x{self.get('hidden')}"


class QualitySpec(_Model):
    """How much quantisation error is allowed: a hard bound on Σω, or a weight θ on it, or neither."""

    max_indicator: Union[float, Literal["uniform"], None] = "uniform"
    """Hard bound on the indicator sum Σω. 'uniform': no worse than the uniform baseline (the highest
    bit-width that fits every device under an even partition); a number: that bound; null: no bound."""
    theta: float = Field(default=0.0, ge=0)
    """Penalty in ms per unit of Σω added to the objective (LLM-PQ's θ); 0 = none."""
    stats: str | None = None
    """Calibration statistics (YAML/JSON): per layer, per linear, max channel range and Σ input variance.
    Without it the indicator is data-free (the same for every layer), and the plan says so."""

    @field_validator("max_indicator")
    @classmethod
    def _non_negative(cls, v):
        if isinstance(v, float) and v < 0:
            raise ValueError("max_indicator must be ≥ 0, 'uniform' or null")
        return v


class MicroBatches(_Model):
    """Micro-batch sizes tried (each must divide the global batch); 'auto' = every power of two that does."""

    prefill: Union[Literal["auto"], list[int]] = "auto"
    decode: Union[Literal["auto"], list[int]] = "auto"

    @field_validator("prefill", "decode")
    @classmethod
    def _positive(cls, v):
        if v != "auto" and (not v or any(x < 1 for x in v)):
            raise ValueError("must be 'auto' or a non-empty list of positive sizes")
        return v


class ServingSpec(_Model):
    """LLM serving on a pipeline of unlike GPUs (LLM-PQ): partition, bit per layer, micro-batches."""

    model: TransformerConfig
    """The transformer: {preset: opt-30b} and/or its shape fields."""
    prompt_len: int = Field(ge=1)
    """Prompt tokens per request."""
    gen_tokens: int = Field(ge=1)
    """Tokens generated per request."""
    global_batch: int = Field(ge=1)
    """Requests served together (all their KV caches stay resident)."""
    bits: list[BitWidth] = Field(default_factory=lambda: [3, 4, 8, 16])
    """Weight bit-widths offered per layer: 2/3/4 GPTQ-style weight-only, 8 LLM.int8-style, 16 FP16."""
    orderable: bool = False
    """Whether the planner may reorder the pipeline devices (it tries distinct device-type orders)."""
    objective: Literal["latency", "throughput"] = "throughput"
    """'latency': the batch's end-to-end time; 'throughput': tokens/s = batch·gen_tokens / that time.
    With a fixed batch both have the same best plan; the choice sets the headline figure."""
    quality: QualitySpec = Field(default_factory=QualitySpec)
    micro_batches: MicroBatches = Field(default_factory=MicroBatches)
    memory_fraction: float = Field(default=0.95, gt=0, le=1)
    """Usable fraction of each device's memory (LLM-PQ: 0.95)."""
    runtime_overhead_gb: float = Field(default=1.9, ge=0)
    """Per-device memory taken by the CUDA context and framework (LLM-PQ measured ~1.9 GB)."""

    @field_validator("bits")
    @classmethod
    def _bits(cls, v):
        if not v:
            raise ValueError("needs at least one bit-width, e.g. [4, 8, 16]")
        if len(set(v)) != len(v):
            raise ValueError(f"bit-widths repeat: {v}")
        return sorted(v)

    @model_validator(mode="after")
    def _fits_context(self) -> "ServingSpec":
        ctx = self.prompt_len + self.gen_tokens
        if ctx > self.model.get("max_positions"):
            raise ValueError(
                f"prompt_len + gen_tokens = {ctx} exceeds the model's max_positions {self.model.get('max_positions')}"
            )
        for phase in ("prefill", "decode"):
            sizes = getattr(self.micro_batches, phase)
            if sizes != "auto":
                bad = [s for s in sizes if self.global_batch % s]
                if bad:
                    raise ValueError(f"micro_batches.{phase} sizes {bad} do not divide global_batch {self.global_batch}")
        return self


class ServingJob(_Model):
    """A whole serving job: the pipeline's devices, the LLM and its workload, solver settings."""

    kind: Literal["serving"] = "serving"
    name: str = "job"
    cluster: Cluster
    """Pipeline devices, expanded device by device in the order listed."""
    serving: ServingSpec
    solver: SolverSpec = Field(default_factory=SolverSpec)

    def digest(self) -> str:
        """Stable hash of the spec's content, recorded in plans for provenance."""
        blob = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", by_alias=True, exclude_defaults=True), sort_keys=False)


def load_serving_spec(source, **overrides) -> ServingJob:
    """A serving job from a path, YAML text, dict or ServingJob; SpecError naming the field."""
    if isinstance(source, ServingJob) and not overrides:
        return source
    data, text, origin = read_document(source)
    return validate(ServingJob, data, text, origin, overrides)
