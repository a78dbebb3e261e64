"""Random draws from a per-call generator, never torch's global one.

`private_rng(seed)` routes every CPU random draw made in its block, on this thread only,
to a fresh `torch.Generator().manual_seed(seed)`: `nn.init.*`, `Tensor.normal_` /
`uniform_` / ..., `torch.randn` / `randint` / ..., and dropout (which has no generator
argument, so it is redrawn here from the private generator). The global generator is
neither read nor advanced, so what the block builds depends on `seed` alone: not on what
the caller did with torch before, nor on other threads drawing at the same time.

A private CPU generator seeded with s produces the same stream as the global one after
`torch.manual_seed(s)` (both are torch's mt19937 CPU generator), so a zoo model built here
has bit for bit the weights it had under `torch.manual_seed(s)` (tests/models/test_private_rng.py).

How: a TorchFunctionMode, and torch keeps the mode stack per thread, so other threads are
untouched. Python's `random` and numpy's global generator are outside its reach; a user's
model factory that draws from those is deterministic only if it seeds them itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_RANDOM_METHODS = frozenset({
    "uniform_", "normal_", "bernoulli_", "random_", "exponential_", "geometric_", "log_normal_", "cauchy_",
})
"""Tensor methods that draw and take `generator=`."""
_RANDOM_FUNCTIONS = frozenset({
    torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal, torch.bernoulli, torch.multinomial,
    torch.poisson, torch.rand_like, torch.randn_like, torch.randint_like,
})
"""torch functions that draw and take `generator=`."""
_DROPOUTS = frozenset({F.dropout, F.dropout1d, F.dropout2d, F.dropout3d})


class _PrivateRNG(TorchFunctionMode):
    def __init__(self, generator: torch.Generator):
        super().__init__()
        self.generator = generator

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _DROPOUTS:
            return _dropout(func, self.generator, *args, **kwargs)
        if kwargs.get("generator", 0) is None or (
            "generator" not in kwargs and (func in _RANDOM_FUNCTIONS or getattr(func, "__name__", "") in _RANDOM_METHODS)
        ):
            if _on_cpu(args, kwargs):
                kwargs["generator"] = self.generator
        return func(*args, **kwargs)


def _on_cpu(args, kwargs) -> bool:
    """A draw on the CPU (a CUDA or meta tensor keeps its own device's generator)."""
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev).type == "cpu"
    for a in (*args, kwargs.get("tensor"), kwargs.get("input")):
        if isinstance(a, torch.Tensor):
            return a.device.type == "cpu"
    return torch.get_default_device().type == "cpu"


def _dropout(func, generator, input, p=0.5, training=True, inplace=False):
    if not training or p == 0.0 or input.device.type != "cpu":
        return func(input, p, training, inplace)
    if func is F.dropout:
        shape = input.shape
    else:  # whole channels: (N, C, 1, ...) masks
        shape = (*input.shape[:2], *([1] * (input.dim() - 2)))
    keep = torch.empty(shape, dtype=input.dtype).bernoulli_(1.0 - p, generator=generator)
    mask = keep / (1.0 - p) if p < 1.0 else keep
    return input.mul_(mask) if inplace else input * mask


@contextmanager
def private_rng(seed: int) -> Iterator[torch.Generator]:
    """Route this thread's CPU random draws in the block to a generator seeded with `seed`."""
    g = torch.Generator().manual_seed(int(seed))
    with _PrivateRNG(g):
        yield g
