"""A Hugging Face causal LM cut into pipeline stages, weights quantised per layer, with a KV cache.

The serving runtime's model. `transformers` builds the model (Llama, OPT or BLOOM family) from the
serving spec's shape (`serving.model`) or loads a checkpoint; `Stage` then holds contiguous
decoder layers of it and runs them with its own attention and a preallocated KV cache, so the
forward is the same in one process and in a pipeline of processes (the pipeline's greedy tokens
equal a single-process run token for token). `family_forward` equals the model's own forward on
unquantised weights (tested against `transformers`' logits).

Weights are weight-only, group-wise, symmetric: per output row and group of `group_size` input
columns, scale = max|w| / (2^(b-1) - 1), codes round(w / scale). 8 bits are stored as int8, 4, 3
and 2 bits as two codes per byte (3 and 2 bits on 4-bit storage: their error, not their memory,
is that of b bits), 16 bits as the compute dtype's 16-bit type. Each forward dequantises to the
compute dtype and runs the library matmul: what weight-only quantisation costs on a device without
low-bit matmul kernels, and what the measured costs price.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

FAMILIES = ("llama", "opt", "bloom")
"""Model families the runtime serves (transformers' LlamaForCausalLM, OPTForCausalLM, BloomForCausalLM)."""

DEFAULT_GROUP = 64
"""Input columns per quantisation group."""


# --------------------------------------------------------------------------------------- quantised linear


def quantize_weight(w: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of `w` [out, in]: codes in [-(2^(b-1)-1), 2^(b-1)-1], scales [out, in // group]."""
    out_f, in_f = w.shape
    qmax = 2 ** (bits - 1) - 1
    g = w.float().reshape(out_f, in_f // group, group)
    scale = g.abs().amax(dim=-1).clamp_min(1e-12) / qmax
    codes = torch.round(g / scale.unsqueeze(-1)).clamp_(-qmax, qmax).to(torch.int8).reshape(out_f, in_f)
    return codes, scale


def group_for(in_features: int, group: int) -> int:
    """The group size used for a linear with `in_features` inputs: `group` when it divides, else the
    whole row (one scale per output row)."""
    return group if group <= in_features and in_features % group == 0 else in_features


class QLinear(nn.Module):
    """A linear layer whose weight is stored at `bits` (16: the 16-bit float of `dtype`; 8: int8 codes;
    ≤ 4: two 4-bit codes per byte) and dequantised to `dtype` at every call."""

    def __init__(self, linear: nn.Linear, bits: int, dtype: torch.dtype, group: int = DEFAULT_GROUP):
        super().__init__()
        w = linear.weight.detach()
        self.bits, self.dtype = int(bits), dtype
        self.out_features, self.in_features = w.shape
        self.group = group_for(self.in_features, group)
        bias = linear.bias.detach().to(dtype) if linear.bias is not None else None
        self.register_buffer("bias", bias)
        if self.bits >= 16:
            store = dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
            self.register_buffer("weight", w.to(store))
            return
        codes, scale = quantize_weight(w, self.bits, self.group)
        self.register_buffer("scale", scale.to(dtype))
        if self.bits == 8:
            self.register_buffer("codes", codes)
        else:
            if self.in_features % 2:
                raise ValueError(f"{self.bits}-bit storage packs two columns per byte: in_features "
                                 f"{self.in_features} is odd")
            u = (codes.to(torch.int16) + 8).to(torch.uint8)
            self.register_buffer("codes", u[:, 0::2] | (u[:, 1::2] << 4))

    def dequantized(self) -> torch.Tensor:
        if self.bits >= 16:
            return self.weight.to(self.dtype)
        if self.bits == 8:
            codes = self.codes
        else:
            lo = (self.codes & 15).to(torch.int8) - 8
            hi = (self.codes >> 4).to(torch.int8) - 8
            codes = torch.stack((lo, hi), dim=-1).reshape(self.out_features, self.in_features)
        w = codes.to(self.dtype).reshape(self.out_features, -1, self.group) * self.scale.unsqueeze(-1)
        return w.reshape(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized(), self.bias)

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())


# --------------------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Shape:
    """What the stages need of the model's config."""
    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    max_positions: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def family_of(hf_model: nn.Module) -> str:
    mt = getattr(hf_model.config, "model_type", "")
    if mt not in FAMILIES:
        raise ValueError(f"model_type {mt!r} is not served; families: {', '.join(FAMILIES)}")
    return mt


def shape_of(hf_model: nn.Module) -> Shape:
    c, fam = hf_model.config, family_of(hf_model)
    if fam == "bloom":
        return Shape(fam, c.n_layer, c.hidden_size, c.n_head, c.n_head, c.vocab_size, 1 << 30)
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    return Shape(fam, c.num_hidden_layers, c.hidden_size, heads, kv, c.vocab_size, c.max_position_embeddings)


def decoder_layers(hf_model: nn.Module) -> nn.ModuleList:
    fam = family_of(hf_model)
    if fam == "llama":
        return hf_model.model.layers
    if fam == "opt":
        return hf_model.model.decoder.layers
    return hf_model.transformer.h


def layer_linears(layer: nn.Module, family: str) -> dict[str, nn.Module]:
    """The decoder layer's linears by attribute path (what the plan's bit-width applies to)."""
    if family == "llama":
        a, m = layer.self_attn, layer.mlp
        return {"self_attn.q_proj": a.q_proj, "self_attn.k_proj": a.k_proj, "self_attn.v_proj": a.v_proj,
                "self_attn.o_proj": a.o_proj, "mlp.gate_proj": m.gate_proj, "mlp.up_proj": m.up_proj,
                "mlp.down_proj": m.down_proj}
    if family == "opt":
        a = layer.self_attn
        return {"self_attn.q_proj": a.q_proj, "self_attn.k_proj": a.k_proj, "self_attn.v_proj": a.v_proj,
                "self_attn.out_proj": a.out_proj, "fc1": layer.fc1, "fc2": layer.fc2}
    a, m = layer.self_attention, layer.mlp
    return {"self_attention.query_key_value": a.query_key_value, "self_attention.dense": a.dense,
            "mlp.dense_h_to_4h": m.dense_h_to_4h, "mlp.dense_4h_to_h": m.dense_4h_to_h}


class KVCache:
    """Keys and values of one stage's layers for a whole batch: [batch, kv_heads, max_len, head_dim]
    per layer. A micro-batch reads and writes its rows."""

    def __init__(self, n_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype, device=None):
        shape = (batch, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def update(self, i: int, rows: slice, pos: int, k: torch.Tensor, v: torch.Tensor):
        t = k.shape[2]
        self.k[i][rows, :, pos:pos + t] = k
        self.v[i][rows, :, pos:pos + t] = v
        return self.k[i][rows, :, :pos + t], self.v[i][rows, :, :pos + t]


def _attend(q, k, v, heads: int, kv_heads: int, bias=None, causal: bool = False):
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal and bias is None)


class Stage(nn.Module):
    """Decoder layers [first, last) of a causal LM, each at its bit-width; the first stage also embeds
    token ids, the last also applies the final norm and the LM head (returning fp32 logits)."""

    def __init__(self, hf_model: nn.Module, first: int, last: int, bits: list[int], *,
                 dtype: torch.dtype = torch.float32, group: int = DEFAULT_GROUP):
        super().__init__()
        shape = shape_of(hf_model)
        if not (0 <= first < last <= shape.layers) or len(bits) != last - first:
            raise ValueError(f"layers [{first}, {last}) with {len(bits)} bit-widths do not fit a "
                             f"{shape.layers}-layer model")
        self.shape, self.first, self.last, self.bits, self.dtype = shape, first, last, list(bits), dtype
        self.embed, self.head = first == 0, last == shape.layers
        fam = shape.family
        layers = decoder_layers(hf_model)
        self.layers = nn.ModuleList()
        for i, b in zip(range(first, last), bits):
            layer = copy.deepcopy(layers[i])  # the stage owns its copy: the model stays unquantised
            for path, lin in layer_linears(layer, fam).items():
                parent, _, name = path.rpartition(".")
                owner = layer.get_submodule(parent) if parent else layer
                setattr(owner, name, QLinear(lin, b, dtype, group))
            self.layers.append(layer)
        for layer in self.layers:  # norms and embeddings in the compute dtype; QLinears keep their storage
            for m in layer.modules():
                if not isinstance(m, QLinear):
                    for p in m.parameters(recurse=False):
                        p.data = p.data.to(dtype)
        self.rotary = None
        if fam == "llama":
            self.rotary = hf_model.model.rotary_emb
            if self.embed:
                self.tok = hf_model.model.embed_tokens
            if self.head:
                self.norm, self.lm_head = hf_model.model.norm, hf_model.lm_head
        elif fam == "opt":
            dec = hf_model.model.decoder
            if self.embed:
                self.tok, self.pos_emb, self.project_in = dec.embed_tokens, dec.embed_positions, dec.project_in
            if self.head:
                self.norm, self.project_out, self.lm_head = dec.final_layer_norm, dec.project_out, hf_model.lm_head
        else:
            tr = hf_model.transformer
            if self.embed:
                self.tok, self.tok_norm = tr.word_embeddings, tr.word_embeddings_layernorm
            if self.head:
                self.norm, self.lm_head = tr.ln_f, hf_model.lm_head
        for name in ("tok", "pos_emb", "tok_norm", "norm", "project_in", "project_out", "lm_head"):
            m = getattr(self, name, None)
            if m is not None:
                m = copy.deepcopy(m)  # a tied LM head is copied apart from the embedding: each stage owns its own
                setattr(self, name, m)
                for p in m.parameters():
                    p.data = p.data.to(dtype)
        self.eval()

    def new_cache(self, batch: int, max_len: int, device=None) -> KVCache:
        s = self.shape
        return KVCache(len(self.layers), batch, s.kv_heads, max_len, s.head_dim, self.dtype, device)

    def weight_bytes(self) -> int:
        """Bytes of this stage's weights as stored (quantised linears at their storage, the rest as is)."""
        seen, total = set(), 0
        for t in list(self.parameters()) + list(self.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
        return total

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, cache: KVCache, rows: slice, pos: int) -> torch.Tensor:
        """Token ids [b, t] (first stage) or hidden states [b, t, h] at positions pos..pos+t-1 → hidden
        states, or fp32 logits of the last position [b, vocab] on the last stage."""
        fam = self.shape.family
        h = self._embed(x, pos) if self.embed else x
        t = h.shape[1]
        positions = torch.arange(pos, pos + t, device=h.device)
        extra = None
        if fam == "llama":
            extra = self.rotary(h, positions.unsqueeze(0).expand(h.shape[0], -1))
        elif fam == "bloom":
            extra = self._alibi(h.shape[0], pos, t, h.device)
        for i, layer in enumerate(self.layers):
            h = self._layer(layer, h, cache, i, rows, pos, extra)
        if not self.head:
            return h
        h = self.norm(h[:, -1:])
        if fam == "opt" and self.project_out is not None:
            h = self.project_out(h)
        return self.lm_head(h)[:, -1].float()

    def _embed(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        fam = self.shape.family
        h = self.tok(ids)
        if fam == "opt":
            if self.project_in is not None:
                h = self.project_in(h)
            offset = getattr(self.pos_emb, "offset", 2)
            idx = torch.arange(pos, pos + ids.shape[1], device=ids.device) + offset
            h = h + F.embedding(idx, self.pos_emb.weight).unsqueeze(0)
        elif fam == "bloom":
            h = self.tok_norm(h)
        return h.to(self.dtype)

    def _alibi(self, b: int, pos: int, t: int, device) -> torch.Tensor:
        """BLOOM's attention bias [1, heads, t, pos+t]: slope·key position, −inf above the diagonal."""
        heads, n = self.shape.heads, pos + t
        closest = 2 ** math.floor(math.log2(heads))
        base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
        slopes = [base ** (i + 1) for i in range(closest)]
        if closest != heads:
            extra_base = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
            slopes += [extra_base ** (2 * i + 1) for i in range(min(closest, heads - closest))]
        s = torch.tensor(slopes, device=device, dtype=torch.float32).view(1, heads, 1, 1)
        keys = torch.arange(n, device=device, dtype=torch.float32).view(1, 1, 1, n)
        bias = s * keys
        q_pos = torch.arange(pos, n, device=device).view(1, 1, t, 1)
        bias = bias.masked_fill(keys.view(1, 1, 1, n) > q_pos, float("-inf"))
        return bias.to(self.dtype)

    def _layer(self, layer, h, cache: KVCache, i: int, rows: slice, pos: int, extra):
        fam, s = self.shape.family, self.shape
        b, t, _ = h.shape
        causal = t > 1
        if fam == "llama":
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)
            k = a.k_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
            v = a.v_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
            cos, sin = extra
            q, k = _rope(q, k, cos.to(q.dtype), sin.to(q.dtype))
            k, v = cache.update(i, rows, pos, k, v)
            o = _attend(q, k, v, s.heads, s.kv_heads, _causal_bias(pos, t, h) if causal and pos else None, causal)
            h = h + a.o_proj(o.transpose(1, 2).reshape(b, t, s.hidden))
            m = layer.mlp
            x = layer.post_attention_layernorm(h)
            return h + m.down_proj(m.act_fn(m.gate_proj(x)) * m.up_proj(x))
        if fam == "opt":
            a = layer.self_attn
            x = layer.self_attn_layer_norm(h) if layer.do_layer_norm_before else h
            q = a.q_proj(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)
            k = a.k_proj(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)
            v = a.v_proj(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)
            k, v = cache.update(i, rows, pos, k, v)
            o = _attend(q, k, v, s.heads, s.heads, _causal_bias(pos, t, h) if causal and pos else None, causal)
            h = h + a.out_proj(o.transpose(1, 2).reshape(b, t, s.hidden))
            if not layer.do_layer_norm_before:
                h = layer.self_attn_layer_norm(h)
            x = layer.final_layer_norm(h) if layer.do_layer_norm_before else h
            h = h + layer.fc2(layer.activation_fn(layer.fc1(x)))
            return h if layer.do_layer_norm_before else layer.final_layer_norm(h)
        a = layer.self_attention
        x = layer.input_layernorm(h)
        fused = a.query_key_value(x).view(b, t, s.heads, 3, s.head_dim)
        q, k, v = (fused[..., j, :].transpose(1, 2) for j in range(3))
        k, v = cache.update(i, rows, pos, k, v)
        o = _attend(q, k, v, s.heads, s.heads, extra)
        residual = x if layer.apply_residual_connection_post_layernorm else h
        h = residual + a.dense(o.transpose(1, 2).reshape(b, t, s.hidden))
        x = layer.post_attention_layernorm(h)
        residual = x if layer.apply_residual_connection_post_layernorm else h
        m = layer.mlp
        return residual + m.dense_4h_to_h(m.gelu_impl(m.dense_h_to_4h(x)))


def _causal_bias(pos: int, t: int, like: torch.Tensor) -> torch.Tensor:
    """[t, pos+t] additive mask: query j (at pos+j) sees keys ≤ pos+j (a chunk after a cached prefix)."""
    keys = torch.arange(pos + t, device=like.device)
    q = torch.arange(pos, pos + t, device=like.device).unsqueeze(1)
    return torch.zeros((t, pos + t), dtype=like.dtype, device=like.device).masked_fill(keys > q, float("-inf"))


def _rope(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rot(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


# --------------------------------------------------------------------------------------- whole-model runs


def cut(hf_model: nn.Module, partition: list[tuple[int, int]], bits: list[int], *,
        dtype: torch.dtype = torch.float32, group: int = DEFAULT_GROUP) -> list[Stage]:
    """The model's stages: `partition` gives each stage's [first, last), `bits` one width per layer."""
    return [Stage(hf_model, a, b, bits[a:b], dtype=dtype, group=group) for a, b in partition]


def micro_slices(batch: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, batch)) for i in range(0, batch, size)]


@torch.inference_mode()
def generate(stages: list[Stage], prompts: torch.Tensor, gen_tokens: int, *, prefill_mb: int,
             decode_mb: int) -> torch.Tensor:
    """Greedy tokens [batch, gen_tokens] in one process, micro-batch by micro-batch as the pipeline runs
    them (prefill micro-batches of `prefill_mb`, then each decode step in micro-batches of `decode_mb`)."""
    batch, plen = prompts.shape
    caches = [s.new_cache(batch, plen + gen_tokens, prompts.device) for s in stages]
    out = torch.zeros((batch, gen_tokens), dtype=torch.long, device=prompts.device)
    for rows in micro_slices(batch, prefill_mb):
        x = prompts[rows]
        for s, c in zip(stages, caches):
            x = s(x, c, rows, 0)
        out[rows, 0] = x.argmax(-1)
    for step in range(1, gen_tokens):
        for rows in micro_slices(batch, decode_mb):
            x = out[rows, step - 1:step]
            for s, c in zip(stages, caches):
                x = s(x, c, rows, plen + step - 1)
            out[rows, step] = x.argmax(-1)
    return out


@torch.inference_mode()
def sequence_logits(stages: list[Stage], ids: torch.Tensor) -> torch.Tensor:
    """fp32 logits [b, t, vocab] of every position of `ids` [b, t] (one prefill, no generation)."""
    b, t = ids.shape
    logits = []
    caches = [s.new_cache(b, t, ids.device) for s in stages]
    x = ids
    for s, c in zip(stages[:-1], caches[:-1]):
        x = s(x, c, slice(0, b), 0)
    last = stages[-1]
    h = last._embed(x, 0) if last.embed else x  # all positions through the last stage, then every logit
    fam = last.shape.family
    positions = torch.arange(0, t, device=ids.device)
    extra = (last.rotary(h, positions.unsqueeze(0).expand(b, -1)) if fam == "llama"
             else last._alibi(b, 0, t, ids.device) if fam == "bloom" else None)
    for i, layer in enumerate(last.layers):
        h = last._layer(layer, h, caches[-1], i, slice(0, b), 0, extra)
    h = last.norm(h)
    if fam == "opt" and last.project_out is not None:
        h = last.project_out(h)
    logits = last.lm_head(h).float()
    return logits


@torch.inference_mode()
def perplexity(stages: list[Stage], tokens: torch.Tensor, window: int, max_windows: int | None = None) -> float:
    """exp(mean next-token NLL) over non-overlapping windows of `window` tokens of the 1-D `tokens`."""
    n = (tokens.numel() - 1) // window
    if max_windows is not None:
        n = min(n, max_windows)
    if n < 1:
        raise ValueError(f"{tokens.numel()} tokens make no window of {window} + 1")
    x = tokens[: n * window].view(n, window)
    y = tokens[1: n * window + 1].view(n, window)
    nll, count = 0.0, 0
    for rows in micro_slices(n, 8):
        logits = sequence_logits(stages, x[rows])
        nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[rows].reshape(-1), reduction="sum").item()
        count += y[rows].numel()
    return math.exp(nll / count)
