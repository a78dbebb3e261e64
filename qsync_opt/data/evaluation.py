"""Test-set evaluation during training, and its log (eval.csv + eval.jsonl in the metrics folder).

Accuracy is the share of test samples (tokens, for language models) whose argmax output is
the label. The model evaluated is the one passed in; the trainer passes a plain fp32 copy of
the synchronised master weights, so eval.csv is the trained network's, not one rank's
quantized forward. With `data.eval_groups`, each group's first rank also evaluates its own
model as it runs it (its plan's formats: what that device would serve) into eval_<group>.csv.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from qsync_opt.data.task import DataJob
from qsync_opt.hardware.cluster import Cluster
from qsync_opt.io import atomic_write_text
from qsync_opt.models.from_spec import build_from_spec

FIELDS = ("step", "train_loss", "test_loss", "test_accuracy", "test_samples", "test_perplexity")


@torch.no_grad()
def evaluate(model: nn.Module, task, batch: int = 500, device: "torch.device | None" = None) -> dict:
    """Mean test loss and accuracy of `model` on `task`'s test set (train/eval mode restored)."""
    was_training = model.training
    model.eval()
    loss_sum, correct, count, per_token = 0.0, 0, 0, False
    try:
        for inputs, targets in task.test_batches(batch):
            if device is not None:
                inputs, targets = tuple(t.to(device) for t in inputs), targets.to(device)
            out = model(*inputs)
            logits = out.reshape(-1, out.size(-1)).float()
            tgt = targets.reshape(-1)
            per_token = per_token or targets.dim() > 1
            loss_sum += F.cross_entropy(logits, tgt, reduction="sum").item()
            correct += (logits.argmax(-1) == tgt).sum().item()
            count += tgt.numel()
    finally:
        model.train(was_training)
    out = {"test_loss": loss_sum / max(count, 1), "test_accuracy": correct / max(count, 1), "test_samples": count}
    if per_token:  # language modelling: perplexity = exp(mean per-token cross-entropy)
        out["test_perplexity"] = math.exp(min(out["test_loss"], 700.0))
    return out


class EvalLog:
    """Appends one record per evaluation; rewrites eval.csv atomically and appends to eval.jsonl."""

    def __init__(self, folder: "str | Path | None", resume: bool = False, stem: str = "eval"):
        self.folder = Path(folder) if folder else None
        self.stem = stem
        self.rows: list[dict] = []
        if self.folder and resume:
            self.rows = read_eval(self.folder, stem)

    def add(self, step: int, train_loss: float | None, result: dict) -> dict:
        row = {"step": step, "train_loss": train_loss, **result}
        self.rows = [r for r in self.rows if r["step"] < step] + [row]  # a resumed run re-evaluates later steps
        if self.folder:
            self.folder.mkdir(parents=True, exist_ok=True)
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(self.rows)
            atomic_write_text(self.folder / f"{self.stem}.csv", buf.getvalue())
            atomic_write_text(self.folder / f"{self.stem}.jsonl", "".join(json.dumps(r) + "\n" for r in self.rows))
        return row


def read_eval(folder: "str | Path", stem: str = "eval") -> list[dict]:
    """The evaluation records a run wrote (empty when it wrote none); stem 'eval_<group>' reads
    a group's own evaluation (data.eval_groups)."""
    f = Path(folder) / f"{stem}.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []


class EvalJob(DataJob, Protocol):
    """What the evaluator reads of a job: `DataJob`'s sections, and the cluster (which ranks lead a group)."""

    @property
    def cluster(self) -> Cluster: ...


class Evaluator:
    """The trainer's hook: on rank 0, every `data.eval_every` steps and after the last, evaluate
    a plain fp32 copy of the master weights and log it. With data.eval_groups the first rank of
    each group also evaluates its own model as it runs (quantized modules included). Other ranks
    do nothing (they wait at the next all-reduce)."""

    def __init__(self, spec: EvalJob, task, folder, rank: int, *, resume: bool = False, total_steps: int | None = None):
        data = getattr(spec, "data", None)
        self.spec, self.task, self.rank = spec, task, rank
        self.every = data.eval_every if data is not None else 0
        self.start = data.eval_start if data is not None else 0
        self.batch = data.eval_batch if data is not None else 500
        self.total = total_steps
        self.log = EvalLog(folder, resume=resume) if rank == 0 else None
        self.group_log = None
        if data is not None and data.eval_groups:
            group = spec.cluster.group_of_rank(rank).name
            if spec.cluster.first_rank(group) == rank:
                self.group_log = EvalLog(folder, resume=resume, stem=f"eval_{group}")
        self._plain: nn.Module | None = None

    def due(self, step: int) -> bool:
        return (self.log is not None or self.group_log is not None) and (
            (self.every and step % self.every == 0 and step >= self.start) or step == self.total)

    def after_step(self, step: int, train_loss: float | None, model: nn.Module) -> dict | None:
        """The master weights' record on rank 0 (None elsewhere); a group's first rank also logs
        its own model's."""
        if not self.due(step):
            return None
        if self.group_log is not None:
            device = next(model.parameters()).device
            self.group_log.add(step, train_loss, evaluate(model, self.task, self.batch, device=device))
        if self.log is None:
            return None
        if self._plain is None:
            state = torch.random.get_rng_state()
            try:
                self._plain = build_from_spec(self.spec)
            finally:
                torch.random.set_rng_state(state)
        # strict=False: a model rewritten for its plan (models.rewrite) keeps only the parameters its graph uses
        self._plain.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()}, strict=False)
        return self.log.add(step, train_loss, evaluate(self._plain, self.task, self.batch))

