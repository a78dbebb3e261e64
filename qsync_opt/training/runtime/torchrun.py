"""`qsync-opt train` as one rank under torchrun (or any launcher that sets the torch.distributed env).

torchrun starts the same command on every node and sets RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT; multi-node jobs then use torchrun's rendezvous, not ours. Each
rank finds its device group from its global rank (groups are numbered in spec order) and
applies that group's env to itself before torch starts its thread pools and oneDNN, which is
why this module lives outside `runtime` (whose package imports torch) and imports nothing heavy
at the top.
"""

from __future__ import annotations

import os
import sys
from qsync_opt.errors import SpecError
from qsync_opt.runtime.emulation import check_emulation
from qsync_opt.training.plan import Plan
from qsync_opt.training.runtime import launch
from qsync_opt.training.runtime.trainer import WorkerConfig, run_worker
from qsync_opt.training.runtime.worker import guarded
from qsync_opt.training.spec import load_spec

#: Keys that act only when a process starts (the dynamic loader, the interpreter): a rank cannot
#: give them to itself, so under torchrun they must be set on the torchrun command instead.
STARTUP_ONLY = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
                "PYTHONUSERBASE", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "DYLD_INSERT_LIBRARIES")


def under_torchrun() -> bool:
    """Whether this process is one rank started by torchrun (or a launcher setting the same env)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "QSYNC_READY_FILE" not in os.environ


def train_rank(args) -> int:
    """Validate, take this rank's group env, train; the exit code of this rank."""

    spec = load_spec(args.spec)
    if spec.kind != "training" or spec.training is None:
        raise SpecError(f"{args.spec}: kind={spec.kind!r}; only training jobs can be trained")
    rank, world = _int_env("RANK"), _int_env("WORLD_SIZE")
    if world != spec.cluster.world_size:
        raise SpecError(
            f"torchrun started WORLD_SIZE={world} processes but the spec's cluster has {spec.cluster.world_size} "
            f"device(s) ({', '.join(f'{g.name}x{g.count}' for g in spec.cluster.groups)}); "
            f"run torchrun with --nnodes x --nproc-per-node = {spec.cluster.world_size}")
    group = spec.cluster.group_of_rank(rank)
    late = [k for k in group.env if k in STARTUP_ONLY and os.environ.get(k) != group.env[k]]
    if late:
        sys.stderr.write(f"rank {rank} ({group.name}): warning: env {', '.join(late)} act only at process start; "
                         "under torchrun set them on the torchrun command line\n")
    if args.threads:  # like the launcher: --threads, unless the group's env sets its own count
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.update({k: v for k, v in group.env.items() if k not in STARTUP_ONLY})
    os.environ["QSYNC_GROUP"] = group.name
    plan = Plan.load(args.plan) if args.plan else None

    import torch  # noqa: F401  (only now: the group's env is in place)

    def run() -> int:
        launch.validate(spec, plan, force=args.force)

        # every rank refuses alike; rank 0 alone announces
        check_emulation(spec, plan, emulate=getattr(args, "emulate", False),
                        log=(lambda s: print(s, file=sys.stderr, flush=True)) if rank == 0 else (lambda s: None))
        if args.resume and not args.checkpoint_dir:
            raise SpecError("--resume needs --checkpoint-dir (where the run saved its checkpoints)")
        metrics = args.metrics_dir or (os.path.join(args.checkpoint_dir, "metrics") if args.checkpoint_dir else None)
        cfg = WorkerConfig(spec=spec, plan=plan, steps=args.steps or spec.training.steps,
                           checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                           resume=args.resume, metrics_dir=metrics, threads=args.threads or 1, force=args.force)
        return run_worker(cfg)

    return guarded(run)


def _int_env(name: str) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw)
    except ValueError:
        raise SpecError(f"environment {name}={raw!r} is not an integer (torchrun sets it)") from None
