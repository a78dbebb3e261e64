"""Phase-aware roofline costs of one decoder layer per device and bit-width (LLM serving and rollout).

Prefill is compute-bound: the layer's GEMM and attention FLOPs at the prompt length, at the
device's FP16 tensor rate. Decode is memory-bound: each step reads the layer's weights at
their bit-width and the KV cache of the current context. Formats below 16 bits are
weight-only (GPTQ 2/3/4, LLM.int8-style 8): weights are stored narrow and computed in FP16
after dequantisation, which costs an unpack/scale pass per weight on the CUDA cores (fused in
the decode GEMV, materialised once per micro-batch in prefill). Each kernel is timed as
max(FLOPs / achieved rate, bytes / achieved bandwidth) plus launch overhead.

Memory follows LLM-PQ (PPoPP'24): weights at the bit-width (plus one FP16 scale per 128
weights for group-wise formats), the KV cache of the whole batch over the full context in
FP16, a peak of prefill activations for one micro-batch, embeddings and the LM head on the
first stage, and a fixed runtime overhead; capacity = fraction × memory − overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

from qsync_opt.hardware.device import DeviceSpec
from qsync_opt.llm.config import TransformerConfig

KERNELS_PER_LAYER = 12
"""Launches per layer and step (norms, QKV, attention, output, FFN, residuals) for launch overhead."""
GROUP_SIZE = 128
"""Weights per FP16 scale in group-wise sub-8-bit formats (GPTQ's usual group)."""
DEQUANT_OPS = {2: 4.0, 3: 5.0, 4: 4.0, 8: 2.0}
"""CUDA-core operations per weight to unpack and scale it (3-bit straddles words: one more)."""
LN_PARAMS_PER_H = 6
"""LayerNorm weights and biases and linear biases of one layer, in units of h (FP16)."""


@dataclass(frozen=True)
class Workload:
    prompt_len: int
    gen_tokens: int
    global_batch: int

    @property
    def context(self) -> int:
        return self.prompt_len + self.gen_tokens

    @property
    def mean_decode_context(self) -> float:
        """Mean past length over the decode steps 2..n (KV reads are linear in it, so this is exact for them)."""
        return self.prompt_len + self.gen_tokens / 2.0


def linear_params(cfg: TransformerConfig) -> tuple[int, int]:
    """(attention, FFN) weight elements of one layer."""
    h, kv = cfg.get("hidden"), cfg.get("kv_heads") * cfg.head_dim
    attn = 2 * h * h + 2 * h * kv  # Q and O are h×h; K and V are h×kv
    ffn = cfg.get("ffn_matrices") * h * cfg.get("ffn")
    return attn, ffn


def weight_bytes(cfg: TransformerConfig, bits: int) -> float:
    """One layer's weights at `bits`: packed linears, their scales, FP16 norms and biases."""
    n = sum(linear_params(cfg))
    scales = 0.0 if bits == 16 else (n / GROUP_SIZE * 2 if bits < 8 else 2.0 * (cfg.get("hidden") * 4 + cfg.get("ffn") * 2))
    return n * bits / 8 + scales + LN_PARAMS_PER_H * cfg.get("hidden") * 2


def kv_bytes(cfg: TransformerConfig, w: Workload) -> float:
    """KV cache of one layer for the whole batch over the full context, FP16 (all micro-batches stay resident)."""
    return 2 * w.global_batch * w.context * cfg.get("kv_heads") * cfg.head_dim * 2


def layer_bytes(cfg: TransformerConfig, w: Workload, bits: int) -> float:
    return weight_bytes(cfg, bits) + kv_bytes(cfg, w)


def activation_peak_bytes(cfg: TransformerConfig, w: Workload, prefill_mb: int) -> float:
    """Peak temporaries while one prefill micro-batch runs a layer (attention scores un-fused, FFN inner)."""
    h, f, s = cfg.get("hidden"), cfg.get("ffn"), w.prompt_len
    hidden_states = 4 * prefill_mb * s * h * 2  # residual, normed input, attention output, one spare
    scores = prefill_mb * cfg.get("heads") * s * s * 2
    inner = prefill_mb * s * f * 2 * (cfg.get("ffn_matrices") - 1)
    return hidden_states + max(scores, inner)


def embedding_bytes(cfg: TransformerConfig) -> float:
    """Token (and position) embeddings plus the LM head, FP16: held by the first stage."""
    h, v = cfg.get("hidden"), cfg.get("vocab")
    tables = v * h + (cfg.get("max_positions") * h if cfg.get("learned_positions") else 0)
    head = 0 if cfg.get("tied_embeddings") else v * h
    return (tables + head) * 2


def capacity_bytes(dev: DeviceSpec, memory_fraction: float, overhead_gb: float) -> float:
    return memory_fraction * dev.memory_bytes - overhead_gb * 1e9


def _kernel_ms(dev: DeviceSpec, flops: float, nbytes: float, dq_weights: float, bits: int) -> float:
    fp16 = dev.achieved_flops("fp16") if dev.supports("fp16") else dev.achieved_flops("fp32")
    bw = dev.bandwidth_gbs * 1e9 * dev.bandwidth_efficiency
    t = max(flops / fp16, nbytes / bw)
    if bits < 16:
        t += dq_weights * DEQUANT_OPS[bits] / dev.achieved_flops("fp32")
    return t * 1e3 + KERNELS_PER_LAYER * dev.launch_overhead_us * 1e-3


def prefill_layer_ms(cfg: TransformerConfig, w: Workload, dev: DeviceSpec, bits: int, mb: int) -> float:
    """One layer's prefill of one micro-batch of `mb` prompts."""
    s = w.prompt_len
    return prefill_layer_ms_lengths(cfg, dev, bits, mb * s, mb * s * s)


def prefill_layer_ms_lengths(cfg: TransformerConfig, dev: DeviceSpec, bits: int, tokens: float,
                             squares: float) -> float:
    """One layer's prefill of one micro-batch of sequences of unequal lengths s_i, given Σ s_i (`tokens`) and
    Σ s_i² (`squares`): the GEMMs and activations are linear in Σ s_i, attention (QKᵀ and AV) in Σ s_i², so a
    ragged batch is not the same as equal sequences of its mean length (that undercounts attention by
    Σ s_i² − (Σ s_i)²/m)."""
    h = cfg.get("hidden")
    n = sum(linear_params(cfg))
    flops = 2 * tokens * n + 4 * squares * h  # GEMMs + QKᵀ and AV
    act = tokens * (8 * h + 2 * cfg.get("ffn")) * 2 + 2 * tokens * cfg.get("kv_heads") * cfg.head_dim * 2
    # below 16 bits the weights are dequantised to FP16 once per micro-batch: read narrow, write and read FP16
    wbytes = weight_bytes(cfg, bits) + (n * 4 if bits < 16 else 0)
    return _kernel_ms(dev, flops, wbytes + act, n if bits < 16 else 0, bits)


def decode_layer_ms(cfg: TransformerConfig, w: Workload, dev: DeviceSpec, bits: int, mb: int) -> float:
    """One layer's decode step of one micro-batch of `mb` sequences at the mean past length."""
    h = cfg.get("hidden")
    n = sum(linear_params(cfg))
    ctx = w.mean_decode_context
    flops = 2 * mb * n + 4 * mb * ctx * h
    kv_read = 2 * mb * ctx * cfg.get("kv_heads") * cfg.head_dim * 2
    act = mb * (8 * h + 2 * cfg.get("ffn")) * 2
    return _kernel_ms(dev, flops, weight_bytes(cfg, bits) + kv_read + act, n if bits < 16 else 0, bits)


def head_ms(cfg: TransformerConfig, w: Workload, dev: DeviceSpec, mb: int, phase: str) -> float:
    """Embedding lookup and LM head (last position only) for one micro-batch, on the first stage."""
    h, v = cfg.get("hidden"), cfg.get("vocab")
    flops = 2 * mb * h * v
    nbytes = v * h * 2 + mb * v * 4 + (mb * w.prompt_len * h * 2 if phase == "prefill" else mb * h * 2)
    return _kernel_ms(dev, flops, nbytes, 0, 16)


def transfer_ms(cfg: TransformerConfig, w: Workload, mb: int, phase: str, bandwidth_gbs: float, latency_us: float) -> float:
    """α + β·bytes for one micro-batch's hidden states crossing one stage boundary (FP16)."""
    tokens = w.prompt_len if phase == "prefill" else 1
    nbytes = mb * tokens * cfg.get("hidden") * 2
    return latency_us * 1e-3 + nbytes / (bandwidth_gbs * 1e9) * 1e3
