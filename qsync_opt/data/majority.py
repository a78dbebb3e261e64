"""The accuracy of always answering the most frequent test label: what a test accuracy is read against.

A classifier that has learnt nothing but the label frequencies scores this, so a test accuracy is
only worth what it adds to it (docs/data.md)."""

from __future__ import annotations

import torch


def majority_rate(task, batch: int = 256) -> tuple[float, int]:
    """(share of the most frequent label among the test targets, number of classes seen)."""
    counts: torch.Tensor | None = None
    for _, targets in task.test_batches(batch):
        c = torch.bincount(targets.reshape(-1).long())
        if counts is None:
            counts = c
        else:
            size = max(len(counts), len(c))
            counts = torch.nn.functional.pad(counts, (0, size - len(counts))) + torch.nn.functional.pad(c, (0, size - len(c)))
    if counts is None or counts.sum() == 0:
        return 0.0, 0
    return counts.max().item() / counts.sum().item(), int((counts > 0).sum())
