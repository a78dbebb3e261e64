"""One measuring process of benchmarks/predictor.py: real training steps of each plan.

`python benchmarks/predictor_worker.py JOB.json`, started with the group's env (and RANK,
WORLD_SIZE, MASTER_* for DDP). For every plan: a fresh model with the plan of this rank's
group applied (runtime.apply_plan), DDP over gloo when WORLD_SIZE > 1, the spec's optimizer;
warm-up steps (DDP rebuilds its buckets after the first), then `blocks` × `repeats` timed
steps; the estimate is their median, in DDP the median over steps of the slowest rank's time
(qsync_opt.training.predictor.step_profile), as the profiler times its whole steps and DDP step and as
`train` reports its iterations.
A step is what the trainer's loop runs: the rank's data, zero_grad, forward, loss, backward
(all-reduce), step, and in DDP the scalar all-reduce of the loss.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def main(job_path: str) -> int:
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from qsync_opt.models.from_spec import build_from_spec
    from qsync_opt.training.predictor.step_profile import lockstep_median_ms, loop_step, step_times_ms
    from qsync_opt.runtime.apply import apply_plan
    from qsync_opt.training.runtime.trainer import make_optimizer
    from qsync_opt.training.spec import load_spec

    job = json.loads(Path(job_path).read_text())
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    if world > 1:
        dist.init_process_group("gloo")
    spec = load_spec(job["spec"])
    group = spec.cluster.group_of_rank(rank).name
    rt = spec.runtime
    out = {}
    try:
        for key, plan in job["plans"]:
            torch.manual_seed(spec.training.seed)
            model = build_from_spec(spec).train()
            model = apply_plan(model, plan[group], kernels=rt.kernels, weight_granularity=rt.weight_granularity,
                               backward_precision=rt.backward_precision, rounding=rt.rounding)
            if world > 1:
                model = nn.parallel.DistributedDataParallel(model)
            opt = make_optimizer(spec.training, [p for p in model.parameters() if p.requires_grad])
            step = loop_step(spec, rank, model, opt, all_reduce_loss=world > 1)

            if world > 1:
                dist.barrier()  # every step all-reduces, so the ranks stay in lockstep from here
            mine = step_times_ms(step, warmup=job["warmup"], calls=job["blocks"] * job["repeats"])
            every = [mine]
            if world > 1:
                every = [None] * world
                dist.all_gather_object(every, mine)  # after the timed steps: no step pays for it
            out[key] = lockstep_median_ms(every)
        if rank == 0:
            Path(job["out"]).write_text(json.dumps(out))
    finally:
        if world > 1:
            dist.barrier()
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from qsync_opt.runtime.process_exit import exit_without_destructors

    exit_without_destructors(main(sys.argv[1]))  # a gloo thread once aborted a finished rank
