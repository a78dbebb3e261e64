"""The two networks of the accuracy harness, small enough to train here in seconds per run.

Both read MNIST-1D (40 points per sample). `resnet1d` is a ResNet-style CNN (stem, two
residual blocks with BatchNorm, a strided downsampling conv, a linear head; `depth` blocks per
stage for a deeper one). `vit1d` is a
ViT-style transformer over 10 patches of 4 points whose attention products are written as
`q @ k.transpose(-2, -1)` and `attn @ v`, the way users write them: the planner selects them
and the runtime can only lower them because models.rewrite gives them modules.
"""

from __future__ import annotations

import torch
from torch import nn


class _Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv1d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm1d(c)
        self.conv2 = nn.Conv1d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm1d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class ResNet1d(nn.Module):
    def __init__(self, width: int = 32, length: int = 40, classes: int = 10, depth: int = 1):
        """`depth` residual blocks per stage (1: the harness's `cnn`, its FQNs `layer1.conv1`...;
        more: `layer1.0.conv1`..., the deeper `cnn-deep`)."""
        super().__init__()
        stage = lambda c: _Block(c) if depth == 1 else nn.Sequential(*[_Block(c) for _ in range(depth)])  # noqa: E731
        self.stem = nn.Conv1d(1, width, 5, padding=2, bias=False)
        self.bn = nn.BatchNorm1d(width)
        self.layer1 = stage(width)
        self.down = nn.Conv1d(width, 2 * width, 3, stride=2, padding=1, bias=False)
        self.bn_down = nn.BatchNorm1d(2 * width)
        self.layer2 = stage(2 * width)
        self.fc = nn.Linear(2 * width * (length // 2), classes)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = self.layer2(torch.relu(self.bn_down(self.down(self.layer1(x)))))
        return self.fc(x.flatten(1))


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int, tokens: int):
        super().__init__()
        self.heads, self.tokens, self.hd = heads, tokens, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        t, h, d = self.tokens, self.heads, self.hd
        q, k, v = self.qkv(x).reshape(-1, t, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q @ k.transpose(-2, -1)) * d ** -0.5).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(-1, t, h * d))


class _EncoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, tokens: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads, tokens)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


class ViT1d(nn.Module):
    def __init__(self, patch: int = 4, tokens: int = 10, dim: int = 64, heads: int = 4, depth: int = 2, classes: int = 10):
        super().__init__()
        self.embed = nn.Linear(patch, dim)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.Sequential(*[_EncoderBlock(dim, heads, tokens) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(tokens * dim, classes)

    def forward(self, x):  # x: (B, tokens, patch)
        x = self.blocks(self.embed(x) + self.pos)
        return self.head(self.norm(x).flatten(1))


def resnet1d(**kw):
    return ResNet1d(**kw)


def vit1d(**kw):
    return ViT1d(**kw)
