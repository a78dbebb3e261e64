"""The profiler's robust time estimator, adaptive so that slow or steady calls stop early.

Median over blocks of the minimum of a few timed calls: the minimum rejects preemption by
other processes within a block, the median rejects a block that was slow throughout. Most of
a profile's time goes to slow calls (formats without native support, whole training steps),
whose block minima agree within a few percent after a few blocks (docs/predictor.md). So:

- warm-up: one call; two more only when it was fast (< SLOW_MS): a slow call has already
  selected its kernels and touched its memory;
- repeats per block: as many as fit in BLOCK_MS (at least 1, at most `repeats`): a call that
  long spans many scheduler slices, so its minimum over more calls buys little;
- blocks: at least `min_blocks`, then stop once the block minima agree within `spread`
  (max − min over median) or the timed calls used up `budget_ms`; at most `blocks`.

QSYNC_OPT_PROFILE_BLOCKS / _REPEATS / _SPREAD / _BUDGET_MS override the defaults.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

BLOCKS = int(os.environ.get("QSYNC_OPT_PROFILE_BLOCKS", 5))
REPEATS = int(os.environ.get("QSYNC_OPT_PROFILE_REPEATS", 5))
MIN_BLOCKS = 3
SPREAD = float(os.environ.get("QSYNC_OPT_PROFILE_SPREAD", 0.05))
BUDGET_MS = float(os.environ.get("QSYNC_OPT_PROFILE_BUDGET_MS", 1500))
SLOW_MS = 10.0
BLOCK_MS = 20.0


def robust_ms(fn: Callable[[], object], *, before: Callable[[], object] | None = None,
              warmup: int | None = None, blocks: int | None = None, repeats: int | None = None,
              spread: float | None = None, budget_ms: float | None = None,
              adaptive: bool = True, clock: Callable[[], float] = time.perf_counter) -> float:
    """Median over blocks of the minimum of timed calls, in ms (see the module docstring).

    `warmup` given: exactly that many untimed calls. `before` runs untimed before each call.
    `adaptive=False`: exactly warmup (default 3) + blocks × repeats calls, as collectives need
    (every rank must make the same number of calls, whatever its own times).
    """
    blocks, repeats = blocks or BLOCKS, repeats or REPEATS
    spread = SPREAD if spread is None else spread
    budget_ms = BUDGET_MS if budget_ms is None else budget_ms

    def timed() -> float:
        if before:
            before()
        t = clock()
        fn()
        return (clock() - t) * 1e3

    if not adaptive:
        warmup = 3 if warmup is None else warmup
    first = timed()
    for _ in range((warmup - 1) if warmup is not None else (0 if first >= SLOW_MS else 2)):
        first = timed()
    per_block = max(1, min(repeats, math.ceil(BLOCK_MS / first) if first > 0 else repeats))
    least = min(MIN_BLOCKS, blocks)
    if not adaptive:
        per_block, least, spread, budget_ms = repeats, blocks, -1.0, float("inf")
    mins: list[float] = []
    used = 0.0
    while len(mins) < blocks:
        ts = [timed() for _ in range(per_block)]
        used += sum(ts)
        mins.append(min(ts))
        if len(mins) >= least:
            med = sorted(mins)[len(mins) // 2]
            if used >= budget_ms or (med > 0 and (max(mins) - min(mins)) / med <= spread):
                break
    mins.sort()
    return mins[len(mins) // 2]
