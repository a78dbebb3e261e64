"""Entry point of one training rank: `python -m qsync_opt.training.runtime.worker SPEC [--plan PLAN] ...`.

Started by `launch` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and the group's own
environment already set (so settings such as ONEDNN_MAX_CPU_ISA are in place before torch
initialises oneDNN). Bad input ends the rank with one line on stderr naming rank and group
and exit code 2, never a traceback; the launcher shows that line when it stops the job.
"""

from __future__ import annotations

import argparse
import os
import sys

from qsync_opt.errors import ModelError, QSyncError, RuntimeSetupError, SpecError
from qsync_opt.training.plan import Plan
from qsync_opt.training.runtime.trainer import WorkerConfig, run_worker
from qsync_opt.training.spec import load_spec

EXIT_FAIL, EXIT_BAD_INPUT = 1, 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qsync_opt.training.runtime.worker")
    p.add_argument("spec")
    p.add_argument("--plan")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--resume-from")
    p.add_argument("--force", action="store_true")
    p.add_argument("--metrics-dir")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    return guarded(lambda: _run(a))


def _run(a) -> int:
    cfg = WorkerConfig(
        spec=load_spec(a.spec),
        plan=Plan.load(a.plan) if a.plan else None,
        steps=a.steps,
        checkpoint_dir=a.checkpoint_dir,
        checkpoint_every=a.checkpoint_every,
        resume=a.resume,
        metrics_dir=a.metrics_dir,
        threads=a.threads,
        resume_from=a.resume_from,
        force=a.force,
    )
    return run_worker(cfg)


def guarded(fn) -> int:
    """Run a rank; a QSyncError becomes one line on stderr and an exit code, not a traceback."""
    try:
        return fn()
    except QSyncError as e:
        bad_input = isinstance(e, (SpecError, RuntimeSetupError, ModelError))
        who = f"rank {os.environ.get('RANK', '?')}" + (f" ({os.environ['QSYNC_GROUP']})" if "QSYNC_GROUP" in os.environ else "")
        sys.stderr.write(f"{who}: error: {e}\n")
        sys.stderr.flush()
        return EXIT_BAD_INPUT if bad_input else EXIT_FAIL


if __name__ == "__main__":
    from qsync_opt.runtime.process_exit import exit_without_destructors

    exit_without_destructors(main())  # files closed, process group destroyed: see process_exit.py
