"""A rank's batches from the data plane (a spec with `data.sources`).

Rank 0 is the coordinator: it holds the only plane (every source's cursor and index, the mix,
the balancer over all ranks, on each rank's c(L) from the plan) and broadcasts each step's
(source, index) ids, lengths and owners. Every rank reads its own samples, pads them (right
padding: a causal model's real positions never see a pad), and sums its next-token losses;
the loss it back-propagates is that sum x world / the global target count, so DDP's average
of the gradients is exactly the gradient of the mean token loss over the whole global batch.
A rank that is given no sample runs a one-token forward with weight 0 (DDP needs every rank
in the all-reduce). The plane's state goes into rank 0's checkpoint differentially
(`loading.checkpoint.DiffCheckpointer`), its full states under <checkpoint_dir>/data_plane/.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from qsync_opt.loading import collate
from qsync_opt.errors import RuntimeSetupError, SpecError
from qsync_opt.loading.checkpoint import DiffCheckpointer
from qsync_opt.loading.engine import open_engine
from qsync_opt.loading.sources import open_source
from qsync_opt.training.data_plane import rank_costs


class PlaneFeed:
    def __init__(self, spec, plan, rank: int, world: int, global_batch: int, device, checkpoint_dir=None,
                 metrics_dir=None, note=print):
        self.rank, self.world, self.device = rank, world, device
        self.global_batch = global_batch
        data = spec.data
        self.engine = None
        self.ckpt = None
        self.log = None
        if rank == 0:
            speeds, costs, origin = rank_costs(spec, plan)
            if len(speeds) != world:
                raise SpecError(f"data plane: the cluster has {len(speeds)} ranks but {world} were started")
            self.engine = open_engine(data, global_batch=global_batch, speeds=speeds, cost=costs)
            self.sources = self.engine.sources if hasattr(self.engine, "sources") else \
                [open_source(s, i) for i, s in enumerate(data.sources)]
            note(f"data plane: {len(data.sources)} sources, balance {data.balance_policy}, speeds "
                 f"{[round(s, 3) for s in speeds]} ({origin})")
            if checkpoint_dir:
                self.ckpt = DiffCheckpointer(Path(checkpoint_dir) / "data_plane", full_every=data.checkpoint_full_every)
            if metrics_dir:
                Path(metrics_dir).mkdir(parents=True, exist_ok=True)
                self.log_path = Path(metrics_dir) / "data_plane.jsonl"
        else:
            self.sources = [open_source(s, i) for i, s in enumerate(data.sources)]

    # ---- checkpoint (rank 0) --------------------------------------------------------------
    def checkpoint_record(self, step: int) -> dict | None:
        if self.engine is None or self.ckpt is None:
            return None
        return self.ckpt.record(step, self.engine.state_dict())

    def after_publish(self) -> None:
        if self.ckpt is not None:
            self.ckpt.prune()

    def resume(self, record: dict | None, step: int, resumed: bool) -> None:
        if self.engine is None:
            return

        if record is None:
            if step:
                raise RuntimeSetupError("checkpoint: it holds no data-plane state (written by a run without "
                                        "data.sources); resume with the spec it was written with, or start fresh")
        else:
            self.engine.load_state_dict(self.ckpt.restore(record))
        self.log = open(self.log_path, "a" if resumed else "w") if getattr(self, "log_path", None) else None
        if self.engine.state_dict()["step"] != step:
            raise RuntimeSetupError(f"checkpoint: the data plane is at step {self.engine.state_dict()['step']} "
                                    f"but the model at step {step}")

    # ---- one step -------------------------------------------------------------------------
    def step(self, model, step: int) -> tuple[torch.Tensor, int, dict]:
        """Forward+backward of this rank's samples; (its token-loss sum, global targets, fields for the log)."""
        box = [None]
        if self.rank == 0:
            p = self.engine.next_batch()
            box = [{"step": p.step, "samples": p.samples, "owner": p.owner, "lengths": p.lengths,
                    "predicted": p.predicted, "plan_ms": p.plan_s * 1e3, "method": p.method}]
            if self.log is not None:
                self.log.write(json.dumps({k: box[0][k] for k in ("step", "samples", "owner", "predicted", "method")})
                               + "\n")
                self.log.flush()
        dist.broadcast_object_list(box, src=0)
        b = box[0]
        if b["step"] != step:
            raise RuntimeError(f"data plane sent step {b['step']} to a rank at step {step}")
        mine = [i for i, o in enumerate(b["owner"]) if o == self.rank]
        global_targets = collate.target_count(b["lengths"])
        if mine:
            ids, mask = collate.pad([self._read(*b["samples"][i]) for i in mine])
            ids, mask = ids.to(self.device), mask.to(self.device)
            logits = model(ids)
            loss_sum = collate.lm_loss_sum(logits.float(), ids, mask)
            weight = self.world / max(global_targets, 1)
        else:
            ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
            loss_sum = model(ids).float().sum() * 0.0
            weight = 0.0
        (loss_sum * weight).backward()
        tokens = int(sum(b["lengths"][i] for i in mine))
        fields = {"samples": len(mine), "tokens": tokens, "global_tokens": int(sum(b["lengths"])),
                  "global_targets": global_targets, "predicted_ms": b["predicted"][self.rank] * 1e3,
                  "predicted_slowest_ms": max(b["predicted"]) * 1e3, "plan_ms": b["plan_ms"]}
        return loss_sum.detach(), global_targets, fields

    def _read(self, s: int, i: int) -> torch.Tensor:
        return self.sources[s].get(i)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        if self.engine is not None:
            self.engine.close()
