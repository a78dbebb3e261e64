"""The gloo all-reduce of this machine, fitted α + β·bytes over a few message sizes.

`world` local processes (spawned, 1 thread each) time all_reduce of 4 KiB .. 16 MiB with a
barrier before each call and the profiler's estimator; rank 0's times are fitted by least
squares. On one host this is the loopback ring DDP uses for CPU ranks here.
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
            out[nbytes] = robust_ms(lambda: dist.all_reduce(x), before=dist.barrier, blocks=3, repeats=3)
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
