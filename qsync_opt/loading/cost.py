"""Cost of one sample of L tokens: c(L) = c0 + a·L + b·L², per device group.

From FLOPs (the default): a forward+backward pass costs 6 FLOPs per token per weight of the
matmuls (2 forward, 4 backward: the rules of `qsync_opt.models.flops`, GEMM backward = 2x
forward), so a = 6·N with N the parameters of the linear layers (embeddings are a gather,
not a matmul, and are left out); attention (QKᵀ and PV, 4·L·d FLOPs per query in
`flops.op_cost("sdpa")`, 2x backward) costs 12·layers·d·L² (6 with a causal kernel that
skips the masked half). c0 = 0.

From measurement: `fit` takes forward+backward times at a few lengths and solves a
non-negative least-squares problem for (c0, a, b) (a per-sample constant is real on a
device: a kernel launch per layer), so c(L) is in seconds and a rank's sum of c(L) is its
predicted compute time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

from qsync_opt.errors import SpecError


@dataclass(frozen=True)
class CostModel:
    """c(L) = c0 + a·L + b·L², in `unit` ('flop' or 's')."""

    a: float
    b: float
    c0: float = 0.0
    unit: str = "flop"

    def __call__(self, length: float) -> float:
        return self.c0 + self.a * length + self.b * length * length

    def costs(self, lengths) -> list[float]:
        return [self(L) for L in lengths]

    @classmethod
    def tokens(cls) -> CostModel:
        """c(L) = L: the `balance: tokens` policy."""
        return cls(a=1.0, b=0.0, unit="token")

    def as_dict(self) -> dict:
        return {"c0": self.c0, "a": self.a, "b": self.b, "unit": self.unit}


def from_shape(linear_params: int, layers: int, hidden: int, *, causal: bool = False) -> CostModel:
    """FLOPs of forward+backward per sample from the model's size: a = 6·N, b = 12·layers·d (6 causal)."""
    for name, v in (("linear_params", linear_params), ("layers", layers), ("hidden", hidden)):
        if not (isinstance(v, int) and v >= 0):
            raise SpecError(f"cost model: {name} must be a non-negative integer, got {v!r}")
    return CostModel(a=6.0 * linear_params, b=(6.0 if causal else 12.0) * layers * hidden)


def from_module(module, *, layers: int, hidden: int, causal: bool = False) -> CostModel:
    """`from_shape` with N counted from the module's nn.Linear weights (tied heads counted once)."""
    from torch import nn

    seen: set[int] = set()
    n = 0
    for m in module.modules():
        if isinstance(m, nn.Linear) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            n += m.weight.numel()
    return from_shape(n, layers, hidden, causal=causal)


def fit(lengths, times, *, constant: bool = True) -> CostModel:
    """Non-negative least squares of times ≈ c0 + a·L + b·L² over measured (length, seconds).

    Exact for three unknowns by enumerating active sets (the best non-negative solution of a
    small least-squares problem is the unconstrained solution on one subset of the columns).
    """
    import numpy as np

    L = np.asarray(lengths, dtype=float).reshape(-1)
    t = np.asarray(times, dtype=float).reshape(-1)
    if len(L) != len(t) or len(L) < 2:
        raise SpecError(f"cost fit: need at least 2 (length, time) pairs of equal count, got {len(L)} and {len(t)}")
    if bool((L <= 0).any()) or not bool(np.isfinite(t).all()) or bool((t < 0).any()):
        raise SpecError("cost fit: lengths must be > 0 and times finite and >= 0")
    cols = {"c0": np.ones_like(L), "a": L, "b": L * L}
    names = ["c0", "a", "b"] if constant else ["a", "b"]
    best, best_err = {n: 0.0 for n in names}, float(t @ t)
    for k in range(1, len(names) + 1):
        for subset in combinations(names, k):
            A = np.stack([cols[n] for n in subset], axis=1)
            sol = _lstsq(A, t)
            if sol is None or any(v < 0 for v in sol):
                continue
            r = A @ np.array(sol) - t
            err = float(r @ r)
            if err < best_err - 1e-18:
                best, best_err = {n: 0.0 for n in names} | dict(zip(subset, sol)), err
    return CostModel(a=best["a"], b=best["b"], c0=best.get("c0", 0.0), unit="s")


def _lstsq(A, y) -> list[float] | None:
    import numpy as np

    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    sol, _res, rank, _sv = np.linalg.lstsq(A / scale, y, rcond=None)
    if rank < A.shape[1]:
        return None
    return [float(v) for v in sol / scale]


def relative_speeds(times_per_rank) -> list[float]:
    """Per-rank relative throughput from the time each rank took on the same reference work:
    the fastest rank is 1.0, a rank twice as slow 0.5."""
    ts = [float(x) for x in times_per_rank]
    if not ts or any(not math.isfinite(x) or x <= 0 for x in ts):
        raise SpecError(f"rank speeds: reference times must be finite and > 0, got {ts}")
    fastest = min(ts)
    return [fastest / x for x in ts]
