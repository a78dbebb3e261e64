"""The gloo all-reduce of this machine, fitted α + β·bytes, and one whole DDP step.

`world` local processes (spawned, 1 thread each) time all_reduce of 4 KiB .. 16 MiB with a
barrier before each call and the profiler's estimator; rank 0's times are fitted by least
squares. On one host this is the loopback ring DDP uses for CPU ranks here.

The DDP step (`measure_ddp_step`): every rank of the spec, each with its group's env and
threads, trains the model at fp32 under DistributedDataParallel exactly as the trainer's
timed step does (zero_grad, forward, loss, backward with the bucket all-reduces, optimizer
step, the scalar all-reduce), a barrier before each step; the slowest rank's estimate is
the lockstep step. What DDP adds beyond the replayed parts (buffer broadcast in forward,
gloo threads taking cores from backward on a shared CPU, the reducer's bucket copies,
stragglers' jitter) is that measurement minus the replay of the same plan
(profile_costs.ddp_overhead), charged once per iteration.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .profiler import _fit_line, robust_ms

ALLREDUCE_BYTES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)


def _allreduce_worker(rank: int, world: int, port: int, result: str) -> None:
    import json

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        out = {}
        for nbytes in ALLREDUCE_BYTES:
            x = torch.ones(nbytes // 4)
            out[nbytes] = robust_ms(lambda: dist.all_reduce(x), before=dist.barrier, blocks=3, repeats=3,
                                    adaptive=False)  # every rank the same calls
        if rank == 0:
            Path(result).write_text(json.dumps(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure_allreduce(world: int) -> dict[str, float]:
    """α (ms) and β (ms per byte) of a gloo all-reduce over `world` local processes."""
    import json
    import tempfile

    import torch.multiprocessing as mp

    from ..runtime.launch import _free_port

    with tempfile.TemporaryDirectory() as d:
        res = str(Path(d) / "ar.json")
        mp.start_processes(_allreduce_worker, args=(world, _free_port(), res), nprocs=world, start_method="spawn")
        ms = {int(k): v for k, v in json.loads(Path(res).read_text()).items()}
    a, b = _fit_line(list(ms), list(ms.values()))
    return {"alpha_ms": b, "beta_ms_per_byte": a}


def ddp_key(spec) -> str:
    """Profile key of one DDP step: world, model, optimizer and every rank's env, threads, batch."""
    import hashlib
    import json

    from .profiler import group_threads

    world = spec.cluster.world_size
    ranks = [(g.env, group_threads(g, world), spec.local_batches()[g.name])
             for g in spec.cluster.groups for _ in range(g.count)]
    ident = json.dumps([spec.model.model_dump(mode="json"), spec.training.optimizer, ranks], sort_keys=True)
    return f"ddp/{world}|{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def _ddp_worker(rank: int, world: int, port: int, spec_file: str, result: str) -> None:
    import json
    import os

    from ..spec import load_spec

    spec = load_spec(spec_file)
    g = spec.cluster.group_of_rank(rank)
    os.environ.update(g.env)  # before any kernel runs: oneDNN reads its ISA cap on first use
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch.distributed as dist

    from ..models.from_spec import input_maker
    from ..runtime.trainer import build_rank_model, make_optimizer
    from .profiler import group_threads

    torch.set_num_threads(group_threads(g, world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = build_rank_model(spec, None, g.name).train()
        ddp = DDP(model)
        opt = make_optimizer(spec.training, model.parameters())
        inputs = tuple(input_maker(spec)(spec.local_batches()[g.name], torch.Generator().manual_seed(rank)))
        with torch.no_grad():
            shape = model(*inputs).shape
        target = torch.randint(0, shape[-1], shape[:-1], generator=torch.Generator().manual_seed(1))

        def step():
            opt.zero_grad(set_to_none=True)
            y = ddp(*inputs)
            loss = nn.functional.cross_entropy(y.reshape(-1, y.size(-1)).float(), target.reshape(-1))
            loss.backward()
            opt.step()
            dist.all_reduce(torch.stack([loss.detach(), torch.zeros(())]))

        # the profiler's estimator (median of block minima), fixed counts: every rank steps alike
        ms = robust_ms(step, before=dist.barrier, warmup=2, blocks=3, repeats=3, adaptive=False)
        Path(f"{result}.{rank}").write_text(json.dumps(ms))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure_ddp_step(spec) -> float:
    """ms of the slowest rank's fp32 DDP training step, every rank of `spec` running here at once."""
    import json
    import tempfile

    import torch.multiprocessing as mp

    from ..runtime.launch import _free_port

    world = spec.cluster.world_size
    with tempfile.TemporaryDirectory() as d:
        spec_file = Path(d) / "spec.json"
        spec_file.write_text(json.dumps(spec.model_dump(mode="json", by_alias=True)))
        res = str(Path(d) / "ddp")
        mp.start_processes(_ddp_worker, args=(world, _free_port(), str(spec_file), res), nprocs=world,
                           start_method="spawn")
        return max(json.loads(Path(f"{res}.{r}").read_text()) for r in range(world))
