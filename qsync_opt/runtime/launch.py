"""Launch synchronous data-parallel training on this machine: one process per rank, torch.distributed.

Ranks are plain processes with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set, joined by
torch.distributed's env:// rendezvous (gloo on CPU, NCCL on GPU) — the launcher itself moves
no data. Spawning the ranks directly, rather than through one torchrun, is what lets ranks of
different device groups start with different environments (ONEDNN_MAX_CPU_ISA, thread counts):
heterogeneity is emulated with real kernel paths, never with sleeps.

Everything that can be checked is checked before a process starts: world size, plan groups
against spec groups, local batches against the global batch, and a dry run of every group's
plan on the model built on the meta device.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..data.imported import add_to_sys_path, import_paths, with_pythonpath
from ..errors import RuntimeSetupError
from ..models.rewrite import applicable_model
from ..io import atomic_write_text
from ..plan import Plan
from ..spec import JobSpec, load_spec
from .apply import apply_plan
from .data import build_model
from .trainer import rank_batches


@dataclass
class JobResult:
    """What a finished (or stopped) run did, read back from the ranks' metrics files."""

    returncodes: list[int]
    steps_done: int
    losses: list[float]
    """Global-batch mean loss after each step, as logged by rank 0 (steps_done entries for a fresh run)."""
    step_ms: dict[int, float]
    """Mean step time per rank."""
    samples_per_s: float
    """Global batch over the slowest rank's mean step time."""
    metrics_dir: str
    checkpoint_dir: str | None = None
    stopped: bool = False
    per_rank: dict[int, list[dict]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes)


def validate(spec: JobSpec, plan: Plan | None, nproc: int | None = None) -> list[int]:
    """Check spec, plan and world size agree; return each rank's local batch."""
    if spec.kind != "training" or spec.training is None:
        raise RuntimeSetupError(f"spec kind={spec.kind!r}: only training jobs can be launched; use kind: training")
    world = spec.cluster.world_size
    if nproc is not None and nproc != world:
        raise RuntimeSetupError(
            f"nproc={nproc} but the spec's cluster has {world} device(s) "
            f"({', '.join(f'{g.name}x{g.count}' for g in spec.cluster.groups)}); pass nproc={world} or change group counts")
    if plan is not None:
        want, have = [g.name for g in spec.cluster.groups], list(plan.groups)
        if sorted(want) != sorted(have):
            raise RuntimeSetupError(
                f"plan groups {have} do not match spec cluster.groups {want}; solve the plan from this spec")
        for g in spec.cluster.groups:
            if plan.groups[g.name].count != g.count:
                raise RuntimeSetupError(
                    f"plan group {g.name!r} has count={plan.groups[g.name].count} but the spec says {g.count}; re-solve")
        if spec.model.name is not None and plan.model != spec.model.name:
            raise RuntimeSetupError(f"plan.model={plan.model!r} but spec model.name={spec.model.name!r}; re-solve")
    batches = rank_batches(spec, plan)
    if sum(batches) != spec.training.global_batch:
        raise RuntimeSetupError(
            f"local batches {batches} sum to {sum(batches)} but training.global_batch={spec.training.global_batch}; "
            "make the groups' local_batch agree with the global batch")
    if plan is not None:
        with torch.device("meta"):
            model = build_model(spec)
        model = applicable_model(model, spec, plan)
        for g in spec.cluster.groups:
            apply_plan(model, plan, g.name, dry_run=True)
    from ..data.check import check_data

    check_data(spec)  # the data loads and fits the model: a bad data section exits 2 before any rank starts
    return batches


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_envs(spec: JobSpec, threads: int, port: int) -> list[dict[str, str]]:
    """Environment of every rank: the launcher's, the group's env, the rendezvous and thread settings."""
    world = spec.cluster.world_size
    envs, rank = [], 0
    for g in spec.cluster.groups:
        for _ in range(g.count):
            env = {**os.environ, "OMP_NUM_THREADS": str(threads), **g.env}
            env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), QSYNC_GROUP=g.name)
            envs.append(env)
            rank += 1
    return envs


def spawn_ranks(argv: list[str], envs: list[dict[str, str]], *, timeout_s: float | None = None,
                grace_s: float = 30.0) -> list[int]:
    """Run `argv` once per environment; if one rank fails, stop the rest. Returns the exit codes.

    SIGTERM/SIGINT to the launcher are forwarded to every rank, which finish their step,
    checkpoint and exit; ranks that do not exit within `grace_s` are killed.
    """
    procs = [subprocess.Popen(argv, env=env) for env in envs]
    forwarded = []

    def forward(signum, frame):
        forwarded.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            failed = any(p.returncode not in (None, 0) for p in procs)
            late = deadline is not None and time.monotonic() > deadline
            if failed or late:
                _terminate(procs, grace_s)
                break
            time.sleep(0.05)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if forwarded:
        _terminate(procs, grace_s)
    return [p.wait() for p in procs]


def _terminate(procs, grace_s):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()


def run_job(spec, plan=None, *, nproc: int | None = None, steps: int | None = None,
            checkpoint_dir: str | None = None, checkpoint_every: int = 10, resume: bool = False,
            threads: int | None = None, metrics_dir: str | None = None, timeout_s: float | None = None) -> JobResult:
    """Validate, spawn one process per rank, wait, and read back the metrics.

    `spec` is a path or a JobSpec; `plan` a path, a Plan, or None (every group in fp32).
    `threads` per rank defaults to the CPU count divided by the world size.
    """
    paths = import_paths(None if isinstance(spec, JobSpec) else spec)  # user code beside the spec, or in the cwd
    add_to_sys_path(paths)
    spec = spec if isinstance(spec, JobSpec) else load_spec(spec)
    plan = plan if (plan is None or isinstance(plan, Plan)) else Plan.load(plan)
    validate(spec, plan, nproc)
    world = spec.cluster.world_size
    steps = steps if steps is not None else spec.training.steps
    threads = threads or max(1, (os.cpu_count() or 1) // world)
    if resume and not checkpoint_dir:
        raise RuntimeSetupError("resume=True needs checkpoint_dir (where the run saved its checkpoints)")
    run_dir = Path(metrics_dir or (Path(checkpoint_dir) / "metrics" if checkpoint_dir else tempfile.mkdtemp(prefix="qsync-run-")))
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_file = atomic_write_text(run_dir / "spec.json", json.dumps(spec.model_dump(mode="json", by_alias=True)))
    argv = [sys.executable, "-m", "qsync_opt.runtime.worker", str(spec_file), "--steps", str(steps),
            "--metrics-dir", str(run_dir), "--threads", str(threads)]
    if plan is not None:
        argv += ["--plan", str(plan.save(run_dir / "plan.json"))]
    if checkpoint_dir:
        argv += ["--checkpoint-dir", str(checkpoint_dir), "--checkpoint-every", str(checkpoint_every)]
    if resume:
        argv.append("--resume")
    envs = [with_pythonpath(env, paths) for env in rank_envs(spec, threads, _free_port())]
    codes = spawn_ranks(argv, envs, timeout_s=timeout_s)
    return _collect(codes, run_dir, spec.training.global_batch, checkpoint_dir)


def _collect(codes, run_dir: Path, global_batch: int, checkpoint_dir) -> JobResult:
    per_rank, stopped = {}, False
    for r in range(len(codes)):
        f = run_dir / f"rank{r}.jsonl"
        records = [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []
        stopped |= any(x.get("event") == "stopped" for x in records)
        by_step = {x["step"]: x for x in records if "loss" in x}  # a resumed run re-logs steps after its checkpoint
        per_rank[r] = [by_step[s] for s in sorted(by_step)]
    rank0 = per_rank.get(0, [])
    step_ms = {r: sum(x["step_ms"] for x in recs) / len(recs) for r, recs in per_rank.items() if recs}
    slowest = max(step_ms.values(), default=0.0)
    return JobResult(
        returncodes=codes,
        steps_done=rank0[-1]["step"] if rank0 else 0,
        losses=[x["loss"] for x in rank0],
        step_ms=step_ms,
        samples_per_s=global_batch / (slowest / 1e3) if slowest else 0.0,
        metrics_dir=str(run_dir),
        checkpoint_dir=checkpoint_dir,
        stopped=stopped,
        per_rank=per_rank,
    )


def launch(spec_path, plan_path=None, *, nproc: int | None = None, steps: int | None = None,
           checkpoint_dir: str | None = None, resume: bool = False, checkpoint_every: int = 10,
           threads: int | None = None) -> int:
    """`qsync-opt train`: run the job and print a summary; returns the exit code (0 = every rank succeeded)."""
    result = run_job(spec_path, plan_path, nproc=nproc, steps=steps, checkpoint_dir=checkpoint_dir,
                     checkpoint_every=checkpoint_every, resume=resume, threads=threads)
    if result.ok:
        if result.losses:
            print(f"trained {result.steps_done} steps: loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}, "
                  f"{result.samples_per_s:.0f} samples/s; per-rank mean step ms "
                  + ", ".join(f"{r}: {ms:.1f}" for r, ms in result.step_ms.items())
                  + f"; metrics in {result.metrics_dir}")
            from ..data.evaluation import read_eval

            if evals := read_eval(result.metrics_dir):
                last = evals[-1]
                print(f"test set after step {last['step']}: accuracy {last['test_accuracy']:.4f}, loss {last['test_loss']:.4f} "
                      f"({last['test_samples']} samples); eval.csv in {result.metrics_dir}")
        if result.stopped:
            print(f"stopped on a signal after step {result.steps_done}"
                  + (f"; continue with resume=True (--resume) and checkpoint_dir={checkpoint_dir}" if checkpoint_dir else ""))
        return 0
    bad = {r: rc for r, rc in enumerate(result.returncodes) if rc != 0}
    print(f"training failed: exit codes by rank {bad}; logs above, metrics in {result.metrics_dir}", file=sys.stderr)
    return 1
