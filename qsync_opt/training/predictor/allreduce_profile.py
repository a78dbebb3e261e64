"""The gloo all-reduce of this machine, fitted α + β·bytes, and one whole DDP step.

`world` local processes (spawned, 1 thread each) time all_reduce of 4 KiB .. 16 MiB with a
barrier before each call and the profiler's estimator; rank 0's times are fitted by least
squares. On one host this is the loopback ring DDP uses for CPU ranks here.

The DDP step (`measure_ddp_step`): every rank of the spec, each with its group's env and
threads, trains the model at fp32 under DistributedDataParallel exactly as the trainer's
timed step does (zero_grad, forward, loss, backward with the bucket all-reduces, optimizer
step, the scalar all-reduce), one barrier, then consecutive steps; the median over steps of
the slowest rank's time is the lockstep step, as `train` reads its iterations (as many steps
as make that median stable: step_profile.adaptive_step_times_ms). The replay
of the same plan is brought to it (profile_costs.ddp_calibrate): what DDP adds beyond the
replayed parts (buffer broadcast in forward, gloo threads taking cores from backward, the
reducer's bucket copies) is charged once per iteration; a replay above it (the co-located
profile's companions never wait, a lockstep's faster rank does) is scaled down to it.

Both are measured by `collectives`, which every rank runs: in the co-located profilers'
processes (colocate.py), the DDP step first of all, while they are as fresh as the ranks
`train` starts, and the all-reduce once their profiling is done; or in processes spawned here
(`measure_allreduce`, `measure_ddp_step`). The DDP step is never read in a process after its
profiling: there it came out a few percent low (benchmarks/ddp_step_readings.py).
"""

from __future__ import annotations

from pathlib import Path
import torch

from qsync_opt.training.predictor.collective_results import Collectives, fit, read_results  # noqa: F401 (re-exported)
from qsync_opt.training.predictor.measuring import ddp_key, group_threads, robust_ms  # noqa: F401 (ddp_key re-exported)
from qsync_opt.training.predictor.step_profile import STEP_WARMUP, adaptive_step_times_ms, loop_step
from qsync_opt.runtime import process_exit
from qsync_opt.training.runtime.launch import free_port
from qsync_opt.training.runtime.trainer import build_rank_model, make_optimizer
from qsync_opt.training.spec import load_spec

ALLREDUCE_BYTES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)


def allreduce_times() -> dict[int, float]:
    """bytes -> ms of a gloo all_reduce in the current process group (every rank calls this)."""
    import torch.distributed as dist

    out = {}
    for nbytes in ALLREDUCE_BYTES:
        x = torch.ones(nbytes // 4)
        out[nbytes] = robust_ms(lambda: dist.all_reduce(x), before=dist.barrier, blocks=3, repeats=3,
                                adaptive=False)  # every rank the same calls
    return out


def ddp_step_times_ms(spec, rank: int) -> list[float]:
    """This rank's times of consecutive fp32 DDP training steps in the current process group, as
    the trainer's timed step runs them; the process already carries its group's env."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    g = spec.cluster.group_of_rank(rank)
    torch.set_num_threads(group_threads(g, spec.cluster.world_size))
    model = build_rank_model(spec, None, g.name).train()
    opt = make_optimizer(spec.training, model.parameters())
    step = loop_step(spec, rank, DDP(model), opt, all_reduce_loss=True)

    def slowest(ms: float) -> float:  # outside the timed call: every rank sees the lockstep's time
        t = torch.tensor([ms], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    # one barrier, then back-to-back steps as a trainer runs them (each all-reduce keeps the
    # lockstep); every rank stops after the same step, so step k of every rank is the same
    # iteration (read_results), once the lockstep's median is stable
    dist.barrier()
    return adaptive_step_times_ms(step, warmup=STEP_WARMUP, agree=slowest)


def collectives(spec, rank: int, world: int, init_method: str, out_dir: Path, *, ar: bool, ddp: bool) -> None:
    """Every rank: join the group, time what is asked, write rank-r results into `out_dir`."""
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        if ar:
            torch.set_num_threads(1)
            times = allreduce_times()
            if rank == 0:
                (out_dir / "allreduce.json").write_text(json.dumps(times))
        if ddp:
            (out_dir / f"ddp.{rank}").write_text(json.dumps(ddp_step_times_ms(spec, rank)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _worker(rank: int, world: int, port: int, spec_file: str | None, out_dir: str, ar: bool, ddp: bool) -> None:
    import os

    spec = None
    if spec_file:
        spec = load_spec(spec_file)
        os.environ.update(spec.cluster.group_of_rank(rank).env)  # before any kernel: oneDNN reads its cap once
    collectives(spec, rank, world, f"tcp://127.0.0.1:{port}", Path(out_dir), ar=ar, ddp=ddp)

    process_exit.exit_without_destructors(0)  # results written; a gloo thread's destructor aborted ~1 in 5 such measurements here


def _spawn(world: int, spec, *, ar: bool, ddp: bool) -> Collectives:
    import json
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        spec_file = None
        if spec is not None:
            spec_file = str(Path(d) / "spec.json")
            Path(spec_file).write_text(json.dumps(spec.model_dump(mode="json", by_alias=True)))
        mp.start_processes(_worker, args=(world, free_port(), spec_file, d, ar, ddp), nprocs=world,
                           start_method="spawn")
        return read_results(Path(d), world)


def measure_allreduce(world: int) -> dict[str, float]:
    """α (ms) and β (ms per byte) of a gloo all-reduce over `world` local processes."""
    return _spawn(world, None, ar=True, ddp=False).allreduce_fit


def measure_ddp_step(spec) -> float:
    """ms of the slowest rank's fp32 DDP training step, every rank of `spec` running here at once."""
    return _spawn(spec.cluster.world_size, spec, ar=False, ddp=True).ddp_step_ms
