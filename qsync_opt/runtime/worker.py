"""Entry point of one training rank: `python -m qsync_opt.runtime.worker SPEC [--plan PLAN] ...`.

Started by `launch` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and the group's own
environment already set (so settings such as ONEDNN_MAX_CPU_ISA are in place before torch
initialises oneDNN).
"""

from __future__ import annotations

import argparse
import sys

from ..plan import Plan
from ..spec import load_spec
from .trainer import WorkerConfig, run_worker


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qsync_opt.runtime.worker")
    p.add_argument("spec")
    p.add_argument("--plan")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--metrics-dir")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    cfg = WorkerConfig(
        spec=load_spec(a.spec),
        plan=Plan.load(a.plan) if a.plan else None,
        steps=a.steps,
        checkpoint_dir=a.checkpoint_dir,
        checkpoint_every=a.checkpoint_every,
        resume=a.resume,
        metrics_dir=a.metrics_dir,
        threads=a.threads,
    )
    return run_worker(cfg)


if __name__ == "__main__":
    sys.exit(main())
