"""The `serving:` section of a job spec: which LLM, which workload, which bits, which goal.

The model is a decoder-only transformer described by its config (`qsync_opt.llm.config`: no
weights are needed to plan; presets give the published configs of the models LLM-PQ (PPoPP'24)
evaluates, and any field may override a preset). Pipeline devices are the spec's
`cluster.groups`, expanded device by device in the order listed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal, Union

import yaml
from pydantic import Field, field_validator, model_validator

from qsync_opt.hardware.cluster import Cluster
from qsync_opt.llm.config import BitWidth, TransformerConfig
from qsync_opt.solver.spec import SolverSpec
from qsync_opt.spec.base import SpecModel as _Model
from qsync_opt.spec.load import read_document, validate


class QualitySpec(_Model):
    """How much quantisation error is allowed: a hard bound on Σω, or a weight θ on it, or neither."""

    max_indicator: Union[float, Literal["uniform"], None] = "uniform"
    """Hard bound on the indicator sum Σω. 'uniform': no worse than the uniform baseline (the highest
    bit-width that fits every device under an even partition); a number: that bound; null: no bound."""
    theta: float = Field(default=0.0, ge=0)
    """Penalty in ms per unit of Σω added to the objective (LLM-PQ's θ); 0 = none."""
    stats: str | None = None
    """Calibration statistics (YAML/JSON): per layer, per linear, max channel range and Σ input variance.
    Without it the indicator is data-free (the same for every layer), and the plan says so. With
    indicator 'empirical': the file of measured per-layer perplexity increases."""
    indicator: Literal["llm-pq", "empirical"] = "llm-pq"
    """'llm-pq': LLM-PQ's Σω proxy (calibrated by `stats`, else data-free); 'empirical': measured perplexity
    increase of each layer alone at each bit-width, read from `stats` (docs/serving.md, "Quality, measured")."""

    @field_validator("max_indicator")
    @classmethod
    def _non_negative(cls, v):
        if isinstance(v, float) and v < 0:
            raise ValueError("max_indicator must be ≥ 0, 'uniform' or null")
        return v

    @model_validator(mode="after")
    def _empirical_needs_stats(self) -> "QualitySpec":
        if self.indicator == "empirical" and not self.stats:
            raise ValueError("indicator 'empirical' needs stats: the file of measured per-layer perplexity increases "
                             "(qsync_opt.serving.quality_measured.write_empirical writes one); give stats or use indicator: llm-pq")
        return self


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


class ServeRuntime(_Model):
    """What `qsync-opt run` serves: the weights, the requests and the compute dtype of the pipeline.

    The model's shape is `serving.model` (what the planner prices); `family` picks the transformers
    class that has it. Prompts are `prompt_len` tokens each: byte-level windows of the Python
    standard library's test-split text (`pysource`, vocabulary 256, the text the training kind's
    byte-level models learn), windows of a local text file (byte-level), or random token ids."""

    family: Literal["llama", "opt", "bloom"] = "llama"
    """transformers model class: LlamaForCausalLM, OPTForCausalLM or BloomForCausalLM."""
    checkpoint: str | None = None
    """Weights: a training run's output folder, a checkpoints folder, a state.pt or a Hugging Face model
    folder (config.json); null = random weights from `seed`."""
    seed: int = Field(default=0, ge=0)
    requests: int | None = Field(default=None, ge=1)
    """Prompts served, in batches of global_batch (a multiple of it; default: one batch)."""
    prompts: str = "pysource"
    """'pysource', 'random', or the path of a text file (byte-level, needs vocab ≥ 256)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype: 'auto' = float16 on CUDA, float32 on CPU. 16-bit layers store 16-bit weights."""
    group_size: int = Field(default=64, ge=2)
    """Input columns per quantisation group (weight-only, symmetric)."""
    perplexity_windows: int = Field(default=16, ge=0)
    """Test-text windows of prompt_len + gen_tokens tokens scored for perplexity (0: skip)."""
    start_timeout_s: float = Field(default=120.0, gt=0)
    """Every stage process must have built its model and joined the others within this many seconds."""

    @field_validator("group_size")
    @classmethod
    def _even(cls, v):
        if v % 2:
            raise ValueError(f"{v} is odd; 4-bit storage packs two columns per byte: give an even size, e.g. 64")
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
    costs: Literal["auto", "measured", "roofline"] = "auto"
    """Per-layer costs: 'roofline' from the device catalog; 'measured' timed here for every group (each
    device must be on this machine; what the cache lacks is measured on first use, in seconds for small
    models); 'auto' (default): a group's measured table when this machine's profile cache holds it
    (`qsync-opt profile SPEC`), else the roofline. The plan says which, per stage."""
    runtime: ServeRuntime = Field(default_factory=ServeRuntime)
    """What `qsync-opt run` serves (weights, prompts, dtype); `solve` does not read it."""

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
        n = self.runtime.requests
        if n is not None and n % self.global_batch:
            raise ValueError(f"runtime.requests: {n} is not a multiple of global_batch {self.global_batch} (requests are "
                             f"served in whole batches); give {n - n % self.global_batch or self.global_batch} or "
                             f"{n + self.global_batch - n % self.global_batch}")
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
        """Stable hash of what the plan depends on (the spec without `serving.runtime`, which only `run` reads),
        recorded in plans for provenance."""
        blob = json.dumps(self.model_dump(mode="json", by_alias=True, exclude={"serving": {"runtime"}}), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", by_alias=True, exclude_defaults=True), sort_keys=False)


def load_serving_spec(source, **overrides) -> ServingJob:
    """A serving job from a path, YAML text, dict or ServingJob; SpecError naming the field."""
    if isinstance(source, ServingJob) and not overrides:
        return source
    data, text, origin = read_document(source)
    return validate(ServingJob, data, text, origin, overrides)
