"""The serving pipeline: one process per plan stage, activations sent stage to stage, tokens back to the first.

Each stage process (`python -m qsync_opt.serving.pipeline WORKDIR`, started by `serve.run_pipeline`
with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT and its device group's env, or by
`torchrun --nproc-per-node S -m qsync_opt.serving.pipeline WORKDIR`) builds the model
(`weights.build`), keeps its plan stage's layers at their bit-widths (`lm.Stage`) and a KV cache
for the whole batch, and runs the schedule every stage derives from the plan alone:

- prefill: the batch in micro-batches of the plan's prefill size, each through the stages in turn;
- decode: every step in micro-batches of the plan's decode size; stage 0 starts a micro-batch's
  step as soon as the last stage has sent back that micro-batch's previous tokens, so with at
  least as many micro-batches as stages every stage has work while the others compute.

Sends are asynchronous (`isend`): a stage computes its next micro-batch while its last output is
in flight. Messages on each link arrive in the order sent, so each receiver knows the shape of
every message from the schedule. The backend is gloo on CPU and NCCL on CUDA.

Each stage writes WORKDIR/stage{r}.json: its compute intervals (phase, step, micro-batch, start,
end, batch round, and when it began waiting for that call's input, on the shared wall clock), weight and KV-cache bytes and peak memory; the last stage also
writes the generated tokens and when each micro-batch's tokens were produced (tokens.pt).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from qsync_opt.runtime.process_exit import EXIT_STOPPED, exit_without_destructors
from qsync_opt.serving import lm
from qsync_opt.serving.weights import ModelSource, build

LINK_TIMEOUT_S = 600
"""A receive waits at most this long (the launcher's watch ends a stuck pipeline long before)."""


def dtype_of(name: str, on_cuda: bool) -> torch.dtype:
    if name == "auto":
        return torch.float16 if on_cuda else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def schedule(batch: int, prefill_mb: int, decode_mb: int, gen_tokens: int) -> list[tuple[str, int, int, slice]]:
    """Every (phase, step, micro-batch index, rows) in the order each stage runs them."""
    out = [("prefill", 0, i, rows) for i, rows in enumerate(lm.micro_slices(batch, prefill_mb))]
    for step in range(1, gen_tokens):
        out += [("decode", step, j, rows) for j, rows in enumerate(lm.micro_slices(batch, decode_mb))]
    return out


class Worker:
    """One stage of the pipeline (rank r of S)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        cfg = json.loads((workdir / "pipeline.json").read_text())
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if self.world != len(cfg["stages"]):
            raise SystemExit(f"WORLD_SIZE {self.world} but the plan has {len(cfg['stages'])} stages")
        self.cfg = cfg
        stage = cfg["stages"][self.rank]
        self.on_cuda = cfg["device"] == "cuda" and torch.cuda.is_available()
        self.device = torch.device(f"cuda:{self.rank % torch.cuda.device_count()}") if self.on_cuda else torch.device("cpu")
        threads = stage.get("threads")
        if threads and not self.on_cuda:
            torch.set_num_threads(int(threads))
        self.dtype = dtype_of(cfg["dtype"], self.on_cuda)
        model = build(ModelSource(**cfg["source"]))
        self.stage = lm.Stage(model, stage["first"], stage["last"], stage["bits"], dtype=self.dtype,
                              group=cfg["group_size"]).to(self.device)
        del model
        self.prompts = torch.load(workdir / "prompts.pt", weights_only=True).to(self.device)
        self.hidden = self.stage.shape.hidden

    def run(self) -> None:
        dist.init_process_group("nccl" if self.on_cuda else "gloo", timeout=timedelta(seconds=LINK_TIMEOUT_S))
        ready = os.environ.get("QSYNC_READY_FILE")
        if ready:
            Path(ready).touch()
        c = self.cfg
        batch, plen, gen = c["global_batch"], c["prompt_len"], c["gen_tokens"]
        rounds = self.prompts.shape[0] // batch
        first, last = self.rank == 0, self.rank == self.world - 1
        events, token_times = [], []
        tokens = torch.zeros((self.prompts.shape[0], gen), dtype=torch.long)
        dist.barrier()
        t0 = time.time()
        cache = self.stage.new_cache(batch, plen + gen, self.device)
        pending = []
        plan = schedule(batch, c["prefill_mb"], c["decode_mb"], gen)  # the same every batch
        sends = [e for e in plan if e[1] < gen - 1]  # what the last stage sends back, in order
        for r in range(rounds):
            prompts = self.prompts[r * batch:(r + 1) * batch]
            out = torch.zeros((batch, gen), dtype=torch.long, device=self.device)
            have = torch.zeros((batch, gen), dtype=torch.bool)  # stage 0: which fed-back tokens arrived
            got = 0  # stage 0: token messages received so far this round (arrive in schedule order)
            for phase, step, mb, rows in plan:
                n = rows.stop - rows.start
                t = plen if phase == "prefill" else 1
                pos = 0 if phase == "prefill" else plen + step - 1
                asked = time.time()
                if first:
                    if phase == "prefill":
                        x = prompts[rows]
                    else:
                        while not have[rows, step - 1].all():  # the last stage's tokens come back in order
                            got = self._recv_tokens(sends, got, out, have)
                        x = out[rows, step - 1:step]
                else:
                    x = torch.empty((n, t, self.hidden), dtype=self.dtype, device=self.device)
                    dist.recv(x, src=self.rank - 1)
                start = time.time()
                y = self.stage(x, cache, rows, pos)
                if last:
                    y = y.argmax(-1)
                if self.on_cuda:
                    torch.cuda.synchronize(self.device)
                end = time.time()
                events.append((phase, step, mb, start - t0, end - t0, r, asked - t0))
                if last:
                    out[rows, step] = y
                    token_times.append((r, step, rows.start, rows.stop, end - t0))
                    if self.world == 1:
                        have[rows, step] = True
                    elif step != gen - 1:
                        msg = y.contiguous()
                        pending.append((dist.isend(msg, dst=0), msg))  # the tensor lives until the send completes
                else:
                    msg = y.contiguous()
                    pending.append((dist.isend(msg, dst=self.rank + 1), msg))
                pending = [(w, m) for w, m in pending if not w.is_completed()]
            if last:
                tokens[r * batch:(r + 1) * batch] = out.cpu()
        for w, _ in pending:
            w.wait()
        peak = (torch.cuda.max_memory_allocated(self.device) if self.on_cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        record = {"rank": self.rank, "layers": [self.stage.first, self.stage.last], "bits": self.stage.bits,
                  "events": events, "weight_bytes": self.stage.weight_bytes(), "kv_bytes": cache.nbytes(),
                  "peak_bytes": int(peak), "peak_kind": "cuda max allocated" if self.on_cuda else "process max RSS",
                  "threads": torch.get_num_threads(), "t0": t0}
        (self.workdir / f"stage{self.rank}.json").write_text(json.dumps(record))
        if last:
            torch.save({"tokens": tokens, "token_times": token_times}, self.workdir / "tokens.pt")
        dist.barrier()
        dist.destroy_process_group()

    def _recv_tokens(self, sends, got: int, out: torch.Tensor, have: torch.Tensor) -> int:
        """Receive the next token message the last stage sends (`sends`: the schedule without the last step)."""
        phase, step, mb, rows = sends[got]
        buf = torch.empty((rows.stop - rows.start,), dtype=torch.long, device=self.device)
        dist.recv(buf, src=self.world - 1)
        out[rows, step] = buf
        have[rows, step] = True
        return got + 1


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m qsync_opt.serving.pipeline WORKDIR (with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)",
              file=sys.stderr)
        return 2

    def stop(signum, frame):
        print(f"stage {os.environ.get('RANK', '?')}: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        exit_without_destructors(EXIT_STOPPED)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, stop)
    Worker(Path(argv[0])).run()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    exit_without_destructors(code)
