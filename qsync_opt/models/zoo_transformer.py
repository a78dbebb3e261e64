"""Transformers in plain torch.nn: BERT (classification), GPT-2 (language model), ViT-B/16.

Module names follow Hugging Face (BERT, GPT-2) and timm (ViT) so plans keyed by FQN carry
over to pretrained checkpoints; parameter counts equal theirs (bert-base with a 2-label head
109,483,778; gpt2 124,439,808 with the tied LM head; vit_base_patch16_224 86,567,656).
Attention products go through `MatMul` modules (`qk`, `av`) so they are selectable ops with
their own FQN; no fused scaled_dot_product_attention. Models return plain logits tensors.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from qsync_opt.models.layers import MatMul


def _split_heads(x, heads: int):
    b, t = x.size(0), x.size(1)
    return x.view(b, t, heads, -1).transpose(1, 2)


def _merge_heads(x):
    b, t = x.size(0), x.size(2)
    return x.transpose(1, 2).reshape(b, t, -1)


def _positions(input_ids):
    """Position ids (1, T), built in forward (a buffer slice by a traced length cannot be traced)."""
    return torch.arange(input_ids.size(1), device=input_ids.device).unsqueeze(0)


def _init_normal(module: nn.Module, std: float = 0.02) -> None:
    """BERT/GPT-2 initialisation: N(0, std) weights, zero biases, unit LayerNorm."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


# --- BERT -----------------------------------------------------------------------------------
class BertEmbeddings(nn.Module):
    def __init__(self, vocab, hidden, max_pos, type_vocab, dropout):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_pos, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids):
        pos = _positions(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos)
        x = x + self.token_type_embeddings(torch.zeros_like(input_ids))
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads = heads
        self.scale = 1.0 / math.sqrt(hidden // heads)
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.qk = MatMul()
        self.av = MatMul()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        q = _split_heads(self.query(x), self.heads)
        k = _split_heads(self.key(x), self.heads)
        v = _split_heads(self.value(x), self.heads)
        scores = self.qk(q, k.transpose(-1, -2)) * self.scale
        probs = self.dropout(scores.softmax(dim=-1))
        return _merge_heads(self.av(probs, v))


class BertResidualOut(nn.Module):
    """dense -> dropout -> LayerNorm(x + residual); HF's BertSelfOutput and BertOutput."""

    def __init__(self, d_in, hidden, dropout):
        super().__init__()
        self.dense = nn.Linear(d_in, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.self = BertSelfAttention(hidden, heads, dropout)
        self.output = BertResidualOut(hidden, hidden, dropout)

    def forward(self, x):
        return self.output(self.self(x), x)


class BertIntermediate(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.dense = nn.Linear(hidden, inter)

    def forward(self, x):
        return nn.functional.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, hidden, heads, inter, dropout):
        super().__init__()
        self.attention = BertAttention(hidden, heads, dropout)
        self.intermediate = BertIntermediate(hidden, inter)
        self.output = BertResidualOut(inter, hidden, dropout)

    def forward(self, x):
        x = self.attention(x)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, layers, hidden, heads, inter, dropout):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(hidden, heads, inter, dropout) for _ in range(layers))

    def forward(self, x):
        for block in self.layer:
            x = block(x)
        return x


class BertPooler(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.activation = nn.Tanh()

    def forward(self, x):
        return self.activation(self.dense(x[:, 0]))


class BertModel(nn.Module):
    def __init__(self, vocab, hidden, layers, heads, inter, max_pos, type_vocab, dropout):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, hidden, max_pos, type_vocab, dropout)
        self.encoder = BertEncoder(layers, hidden, heads, inter, dropout)
        self.pooler = BertPooler(hidden)

    def forward(self, input_ids):
        return self.pooler(self.encoder(self.embeddings(input_ids)))


class BertForSequenceClassification(nn.Module):
    """BERT encoder + pooler + linear head: (B, T) int64 token ids -> (B, num_labels) logits."""

    def __init__(self, vocab_size=30522, hidden=768, layers=12, heads=12, intermediate=3072,
                 max_positions=512, type_vocab=2, num_labels=2, dropout=0.1):
        super().__init__()
        self.max_positions = max_positions
        self.bert = BertModel(vocab_size, hidden, layers, heads, intermediate, max_positions,
                              type_vocab, dropout)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, num_labels)
        _init_normal(self)

    def forward(self, input_ids):
        return self.classifier(self.dropout(self.bert(input_ids)))


# --- GPT-2 ----------------------------------------------------------------------------------
class GPT2Attention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads, self.hidden = heads, hidden
        self.scale = 1.0 / math.sqrt(hidden // heads)
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.qk = MatMul()
        self.av = MatMul()
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        t = x.size(1)
        qkv = self.c_attn(x).split(self.hidden, dim=2)
        q, k, v = (_split_heads(qkv[i], self.heads) for i in range(3))
        scores = self.qk(q, k.transpose(-1, -2)) * self.scale
        pos = torch.arange(t, device=x.device)
        future = pos.unsqueeze(0) > pos.unsqueeze(1)  # (T, T): key j is after query i
        scores = scores.masked_fill(future, float("-inf"))
        probs = self.attn_dropout(scores.softmax(dim=-1))
        return self.resid_dropout(self.c_proj(_merge_heads(self.av(probs, v))))


class GPT2MLP(nn.Module):
    def __init__(self, hidden, dropout):
        super().__init__()
        self.c_fc = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class GPT2Block(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = GPT2Attention(hidden, heads, dropout)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.mlp = GPT2MLP(hidden, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, vocab, hidden, layers, heads, max_pos, dropout):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_pos, hidden)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(GPT2Block(hidden, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, input_ids):
        pos = _positions(input_ids)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    """GPT-2 with the LM head tied to the token embedding: (B, T) ids -> (B, T, vocab) logits."""

    def __init__(self, vocab_size=50257, hidden=768, layers=12, heads=12, max_positions=1024,
                 dropout=0.1):
        super().__init__()
        self.max_positions = max_positions
        self.transformer = GPT2Model(vocab_size, hidden, layers, heads, max_positions, dropout)
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)
        _init_normal(self)
        for block in self.transformer.h:  # GPT-2's scaled init of residual projections
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * layers))
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids):
        return self.lm_head(self.transformer(input_ids))


# --- ViT ------------------------------------------------------------------------------------
class PatchEmbed(nn.Module):
    def __init__(self, patch, hidden):
        super().__init__()
        self.proj = nn.Conv2d(3, hidden, patch, patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class ViTAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.scale = (hidden // heads) ** -0.5
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.qk = MatMul()
        self.av = MatMul()
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, t = x.size(0), x.size(1)
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        probs = self.qk(q * self.scale, k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj(_merge_heads(self.av(probs, v)))


class ViTMlp(nn.Module):
    def __init__(self, hidden, mlp):
        super().__init__()
        self.fc1 = nn.Linear(hidden, mlp)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(mlp, hidden)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class ViTBlock(nn.Module):
    def __init__(self, hidden, heads, mlp):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, eps=1e-6)
        self.attn = ViTAttention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-6)
        self.mlp = ViTMlp(hidden, mlp)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """ViT with a class token: (B, 3, H, W) images -> (B, num_classes) logits."""

    def __init__(self, image_size=224, patch=16, hidden=768, layers=12, heads=12, mlp=3072,
                 num_classes=1000):
        super().__init__()
        self.patch_embed = PatchEmbed(patch, hidden)
        tokens = (image_size // patch) ** 2 + 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, hidden))
        self.blocks = nn.Sequential(*(ViTBlock(hidden, heads, mlp) for _ in range(layers)))
        self.norm = nn.LayerNorm(hidden, eps=1e-6)
        self.head = nn.Linear(hidden, num_classes)
        _init_normal(self)
        nn.init.normal_(self.pos_embed, 0.0, 0.02)
        nn.init.normal_(self.cls_token, 0.0, 1e-6)

    def forward(self, x):
        x = self.patch_embed(x)
        cls = self.cls_token.expand(x.size(0), -1, -1)
        x = torch.cat((cls, x), dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])
