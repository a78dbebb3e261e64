"""What a rank does with its ids: read, pad, and a loss whose sum over ranks is the global mean.

With unequal sample or token counts per rank, averaging per rank and then over ranks weighs
a rank's tokens by 1/its count: the gradient is not that of the global batch. Each rank
instead sums its token losses and divides by the global token count; an all-reduce SUM of
the gradients is then exactly single-process training on the whole global batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pad(samples: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, Lmax], mask [B, Lmax] True on real tokens) from 1-D token tensors."""
    if not samples:
        return torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0, dtype=torch.bool)
    L = max(int(s.numel()) for s in samples)
    ids = torch.full((len(samples), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(samples), L, dtype=torch.bool)
    for i, s in enumerate(samples):
        ids[i, : s.numel()] = s
        mask[i, : s.numel()] = True
    return ids, mask


def target_count(lengths) -> int:
    """Next-token targets in a batch of these lengths (L − 1 per sample)."""
    return int(sum(max(int(L) - 1, 0) for L in lengths))


def lm_loss_sum(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ next-token cross-entropy over real positions (logits [B, L, V] for ids [B, L])."""
    if logits.numel() == 0:
        return logits.sum()
    valid = mask[:, 1:] & mask[:, :-1]
    losses = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none")
    return (losses * valid.reshape(-1).to(losses.dtype)).sum()


def normalised_loss(loss_sum: torch.Tensor, global_targets: int) -> torch.Tensor:
    """This rank's share of the global mean loss: all-reduce SUM of its gradients is the global one."""
    return loss_sum / max(int(global_targets), 1)
