"""The simulator's workload: the prompt and response lengths of every trajectory a run may admit, drawn once per
seed (rollout.simulate.Simulator and rollout.bounds.ceiling draw the same ones)."""

from __future__ import annotations

import numpy as np


def draw(job, steps: int, eta: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompts, targets) of the first (steps + η + 2) × batch trajectories, in admission order: no policy admits
    more, since every one waits for the trainer's version (η + version + 1) × batch."""
    w = job.rollout.workload
    n_max = (steps + eta + 2) * w.batch
    rng = np.random.RandomState(seed)
    targets = sample_lengths(w.response, n_max, rng, w.max_len)
    groups = (n_max + w.group_size - 1) // w.group_size
    if isinstance(w.prompt_len, int):
        prompts = np.full(groups, w.prompt_len, dtype=np.int64)
    else:
        prompts = sample_lengths(w.prompt_len, groups, rng, w.max_prompt())
    return np.repeat(prompts, w.group_size)[:n_max], targets


def sample_lengths(dist, n, rng, cap) -> np.ndarray:
    """`n` lengths of `dist` (a LengthDist) from `rng`: a file's lengths with replacement, or a lognormal's rounded to
    whole tokens; each clipped to [1, cap]. LengthDist.mean(cap) is the mean of this draw."""
    if dist.file is not None:
        xs = np.asarray(dist.observed(), dtype=np.int64)
        out = xs[rng.randint(0, len(xs), size=n)]
    elif dist.sigma == 0:
        out = np.full(n, int(round(dist.median)), dtype=np.int64)
    else:
        out = np.rint(dist.median * np.exp(dist.sigma * rng.standard_normal(n))).astype(np.int64)
    return np.clip(out, 1, cap)
