"""Models written the way users write them: GEMMs as functional calls, no modules to swap."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MatmulNet(nn.Module):  # torch.matmul against a parameter
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 32) * 0.2)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(torch.relu(torch.matmul(x, self.w)))


class AtNet(nn.Module):  # `@` between two activations (attention scores)
    def __init__(self, d_in=16):
        super().__init__()
        self.proj = nn.Linear(d_in, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        h = self.proj(x).reshape(-1, 4, 4)
        s = (h @ h.transpose(1, 2)).softmax(-1) @ h
        return self.head(s.reshape(-1, 16))


class BmmNet(nn.Module):  # torch.bmm
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        h = self.proj(x).reshape(-1, 4, 4)
        return self.head(torch.bmm(h, h.transpose(1, 2)).reshape(-1, 16))


class LinearNet(nn.Module):  # F.linear with the module's own parameters
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(32, 16) * 0.2)
        self.bias = nn.Parameter(torch.zeros(32))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(F.relu(F.linear(x, self.weight, self.bias)))


class Block(nn.Module):  # F.conv2d inside a submodule: the op is named under the block's FQN
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 1, 3, 3) * 0.3)
        self.bias = nn.Parameter(torch.zeros(8))

    def forward(self, x):
        return F.relu(F.conv2d(x, self.weight, self.bias, padding=1))


class Conv2dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.head(self.block(x.reshape(-1, 1, 4, 4)).flatten(1))


def matmul_net():
    return MatmulNet()


def at_net(d_in=16):
    return AtNet(d_in)


def bmm_net():
    return BmmNet()


def linear_net():
    return LinearNet()


def conv2d_net():
    return Conv2dNet()
