"""The measured cost of one stage-to-stage message of a serving pipeline on this machine.

When every stage of a serving pipeline runs on this machine's CPU, a hop is not a wire: it is gloo's
send and receive between two local processes, whose fixed cost (tens of microseconds idle, far more on
a loaded machine) the catalog's `loopback` figures cannot know. Two processes (`python -m
qsync_opt.serving.link DIR`, joined by torch.distributed like the pipeline's stages) bounce a tensor of
each size the planner sends (hidden states of a prefill or decode micro-batch) back and forth, as the
pipeline does (isend, blocking recv); half the median round trip is one hop. The serving profiler
caches the figures beside the per-layer costs and the planner prices hops with them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from qsync_opt.runtime.spawn import free_port

WARMUP = 5
ROUNDS = int(os.environ.get("QSYNC_OPT_LINK_ROUNDS", 40))
"""Round trips timed per message size (both processes run the same count)."""


def entry(nbytes: int) -> str:
    return f"hop|bytes={int(nbytes)}"


def measure(sizes: list[int], timeout_s: float = 120.0) -> dict[str, float]:
    """{entry(size): one hop in ms} for float32 messages of `sizes` bytes, from two fresh processes."""
    port = free_port()
    root = str(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory(prefix="qsync-link-") as d:
        (Path(d) / "sizes.json").write_text(json.dumps(sorted(set(int(x) for x in sizes))))
        procs = []
        for r in range(2):
            env = {**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
            procs.append(subprocess.Popen([sys.executable, "-m", "qsync_opt.serving.link", d], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        errs = []
        for p in procs:
            try:
                errs.append(p.communicate(timeout=timeout_s)[1])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"measuring the stage-to-stage link took over {timeout_s:g} s") from None
        if any(p.returncode for p in procs):
            raise RuntimeError("measuring the stage-to-stage link failed: " + " | ".join(e.strip()[-500:] for e in errs))
        return json.loads((Path(d) / "result.json").read_text())


def bounce(workdir: Path) -> None:
    import torch  # import cost: torch (only the measuring processes)
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    sizes = json.loads((workdir / "sizes.json").read_text())
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    out = {}
    for nbytes in sizes:
        x = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
        y = torch.empty_like(x)
        times = []
        for i in range(WARMUP + ROUNDS):
            t = time.perf_counter()
            if rank == 0:
                dist.isend(x, dst=1).wait()
                dist.recv(y, src=1)
            else:
                dist.recv(y, src=0)
                dist.isend(y, dst=0).wait()
            if i >= WARMUP:
                times.append(time.perf_counter() - t)
        out[entry(nbytes)] = statistics.median(times) * 1e3 / 2
    dist.barrier()
    if rank == 0:
        (workdir / "result.json").write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    from qsync_opt.runtime.process_exit import exit_without_destructors

    bounce(Path(sys.argv[1]))
    exit_without_destructors(0)
