"""Test-set evaluation during training, and its log (eval.csv + eval.jsonl in the metrics folder).

Accuracy is the share of test samples (tokens, for language models) whose argmax output is
the label. The model evaluated is the one passed in; the trainer passes a plain fp32 copy of
the synchronised master weights, so the figure is the trained network's, not one rank's
quantized forward.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..io import atomic_write_text

FIELDS = ("step", "train_loss", "test_loss", "test_accuracy", "test_samples")


@torch.no_grad()
def evaluate(model: nn.Module, task, batch: int = 500, device: "torch.device | None" = None) -> dict:
    """Mean test loss and accuracy of `model` on `task`'s test set (train/eval mode restored)."""
    was_training = model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    try:
        for inputs, targets in task.test_batches(batch):
            if device is not None:
                inputs, targets = tuple(t.to(device) for t in inputs), targets.to(device)
            out = model(*inputs)
            logits = out.reshape(-1, out.size(-1)).float()
            tgt = targets.reshape(-1)
            loss_sum += F.cross_entropy(logits, tgt, reduction="sum").item()
            correct += (logits.argmax(-1) == tgt).sum().item()
            count += tgt.numel()
    finally:
        model.train(was_training)
    return {"test_loss": loss_sum / max(count, 1), "test_accuracy": correct / max(count, 1), "test_samples": count}


class EvalLog:
    """Appends one record per evaluation; rewrites eval.csv atomically and appends to eval.jsonl."""

    def __init__(self, folder: "str | Path | None", resume: bool = False):
        self.folder = Path(folder) if folder else None
        self.rows: list[dict] = []
        if self.folder and resume:
            self.rows = read_eval(self.folder)

    def add(self, step: int, train_loss: float | None, result: dict) -> dict:
        row = {"step": step, "train_loss": train_loss, **result}
        self.rows = [r for r in self.rows if r["step"] < step] + [row]  # a resumed run re-evaluates later steps
        if self.folder:
            self.folder.mkdir(parents=True, exist_ok=True)
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(self.rows)
            atomic_write_text(self.folder / "eval.csv", buf.getvalue())
            atomic_write_text(self.folder / "eval.jsonl", "".join(json.dumps(r) + "\n" for r in self.rows))
        return row


def read_eval(folder: "str | Path") -> list[dict]:
    """The evaluation records a run wrote (empty when it wrote none)."""
    f = Path(folder) / "eval.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []


class Evaluator:
    """The trainer's hook: on rank 0, every `data.eval_every` steps and after the last, evaluate
    a plain fp32 copy of the master weights and log it. Other ranks do nothing (they wait at
    the next all-reduce)."""

    def __init__(self, spec, task, folder, rank: int, *, resume: bool = False, total_steps: int | None = None):
        data = getattr(spec, "data", None)
        self.spec, self.task, self.rank = spec, task, rank
        self.every = data.eval_every if data is not None else 0
        self.batch = data.eval_batch if data is not None else 500
        self.total = total_steps
        self.log = EvalLog(folder, resume=resume) if rank == 0 else None
        self._plain: nn.Module | None = None

    def due(self, step: int) -> bool:
        return self.rank == 0 and ((self.every and step % self.every == 0) or step == self.total)

    def after_step(self, step: int, train_loss: float | None, model: nn.Module) -> dict | None:
        if not self.due(step):
            return None
        if self._plain is None:
            from ..models.from_spec import build_from_spec

            state = torch.random.get_rng_state()
            try:
                self._plain = build_from_spec(self.spec)
            finally:
                torch.random.set_rng_state(state)
        # strict=False: a model rewritten for its plan (models.rewrite) keeps only the parameters its graph uses
        self._plain.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()}, strict=False)
        return self.log.add(step, train_loss, evaluate(self._plain, self.task, self.batch))
