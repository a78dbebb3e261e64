"""Launch synchronous data-parallel training on this machine: one process per rank, torch.distributed.

Ranks are plain processes with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set, joined by
torch.distributed's env:// rendezvous (gloo on CPU, NCCL on GPU) — the launcher itself moves
no data. Spawning the ranks directly, rather than through one torchrun, is what lets ranks of
different device groups start with different environments (ONEDNN_MAX_CPU_ISA, thread counts):
heterogeneity is emulated with real kernel paths, never with sleeps.

Everything that can be checked is checked before a process starts: world size, plan groups
against spec groups, local batches against the global batch, the precisions each device's
runtime can run, the plan's graph fingerprint, a dry run of every group's plan on the model
built on the meta device, and (for a resume) which checkpoint is valid. `spawn.py` then
watches every rank so that no failure can leave the job hanging. Under torchrun the same
worker runs without this launcher (`qsync_opt/torchrun.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from qsync_opt.data.imported import add_to_sys_path, import_paths, with_pythonpath
from qsync_opt.errors import RuntimeSetupError
from qsync_opt.models.rewrite import applicable_model
from qsync_opt.io import atomic_write_text
from qsync_opt.training.plan import Plan
from qsync_opt.training.spec import JobSpec, load_spec
from qsync_opt.runtime import checkpoint as ckpt
from qsync_opt.runtime.apply import apply_plan
from qsync_opt.runtime.data import build_model
from qsync_opt.runtime.process_exit import Stopped, stop_on_signals
from qsync_opt.runtime.spawn import Spawned, free_port, spawn_ranks
from qsync_opt.runtime.support import precision_refusal
from qsync_opt.training.runtime.trainer import EXIT_STOPPED, check_backward_precision, rank_batches
from qsync_opt.data.check import check_data
from qsync_opt.data.evaluation import read_eval
from qsync_opt.runtime.emulation import check_emulation


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
    """Stopped by a signal in this attempt (after checkpointing), not finished."""
    per_rank: dict[int, list[dict]] = field(default_factory=dict)
    failure: str | None = None
    """Which rank failed first, how, and the tail of its stderr."""
    failed_code: int | None = None
    wall_s: float = 0.0
    killed_after_grace: bool = False
    """Stopped, but a rank still in its step at the end of the grace period was killed (the step is lost)."""
    stop_signal: str | None = None
    """The signal that asked the launcher to stop (None: none did, or it went to the ranks alone)."""

    @property
    def ok(self) -> bool:
        """Every rank ended normally: completed, or stopped on a signal (killed at the end of the
        launcher's grace period counts as stopped: the last published checkpoint stands)."""
        fine = (0, EXIT_STOPPED, -signal.SIGTERM) if self.stopped else (0, EXIT_STOPPED)
        if self.stopped and self.killed_after_grace:
            fine = (*fine, -signal.SIGKILL)
        return self.failure is None and all(rc in fine for rc in self.returncodes)

    @property
    def status(self) -> str:
        return "failed" if not self.ok else "stopped" if self.stopped else "completed"

    @property
    def exit_code(self) -> int:
        """`qsync-opt train`'s exit code: 0 completed, 4 stopped, 2 a rank refused its input, 1 otherwise."""
        if self.status == "failed":
            return 2 if self.failed_code == 2 else 1
        return EXIT_STOPPED if self.status == "stopped" else 0

    def summary(self) -> dict:
        """The JSON result: status first, then what a scheduler needs to act on it."""
        return {"status": self.status, "exit_code": self.exit_code, "steps_done": self.steps_done,
                "loss_first": self.losses[0] if self.losses else None,
                "loss_last": self.losses[-1] if self.losses else None, "samples_per_s": self.samples_per_s,
                "step_ms": {str(r): ms for r, ms in self.step_ms.items()}, "returncodes": self.returncodes,
                "failure": self.failure, "killed_after_grace": self.killed_after_grace, "wall_s": round(self.wall_s, 3), "metrics_dir": self.metrics_dir,
                "checkpoint_dir": self.checkpoint_dir}


def check_job(spec: JobSpec, plan: Plan | None, nproc: int | None = None, *, plan_name: str = "the plan") -> list[int]:
    """The checks that need no work (no model, no data): kind, world size, and that the plan was
    solved for this spec's groups, counts, model and global batch. Returns each rank's local batch.

    `plan_name` names the plan in messages (`--plan p.json` for `train`)."""
    if spec.kind != "training" or spec.training is None:
        raise RuntimeSetupError(f"spec kind={spec.kind!r}: only training jobs can be launched; use kind: training")
    world = spec.cluster.world_size
    if nproc is not None and nproc != world:
        raise RuntimeSetupError(
            f"nproc={nproc} but the spec's cluster has {world} device(s) "
            f"({', '.join(f'{g.name}x{g.count}' for g in spec.cluster.groups)}); pass nproc={world} or change group counts")
    fix = "solve this spec (`qsync-opt solve SPEC -o PLAN`) and pass that plan"
    if plan is not None:
        want, have = [g.name for g in spec.cluster.groups], list(plan.groups)
        if sorted(want) != sorted(have):
            raise RuntimeSetupError(
                f"{plan_name}: solved for groups {have} (job {plan.job!r}) but this spec's cluster.groups are {want}; "
                f"it was solved from another spec: {fix}")
        for g in spec.cluster.groups:
            if plan.groups[g.name].count != g.count:
                raise RuntimeSetupError(
                    f"{plan_name}: group {g.name!r} has count {plan.groups[g.name].count} but this spec says "
                    f"{g.count}; {fix}")
        if spec.model.name is not None and plan.model != spec.model.name:
            raise RuntimeSetupError(f"{plan_name}: solved for model {plan.model!r} but this spec's model.name is "
                                    f"{spec.model.name!r}; {fix}")
    batches = rank_batches(spec, plan)
    if sum(batches) != spec.training.global_batch:
        whose = f"{plan_name}'s" if plan is not None else "the groups'"
        raise RuntimeSetupError(
            f"{whose} local batches {batches} sum to {sum(batches)} but training.global_batch={spec.training.global_batch}; "
            + (fix if plan is not None else "make the groups' local_batch agree with the global batch"))
    return batches


def validate(spec: JobSpec, plan: Plan | None, nproc: int | None = None, *, force: bool = False,
             plan_name: str = "the plan") -> list[int]:
    """`check_job`, then the checks that build things: every group's plan applied (dry run) to the
    model on the meta device, and the data loaded and run through the model. Returns each rank's
    local batch."""
    batches = check_job(spec, plan, nproc, plan_name=plan_name)
    if plan is not None:
        check_backward_precision(spec, plan)
        with torch.device("meta"):
            model = build_model(spec)
        model = applicable_model(model, spec, plan)
        for g in spec.cluster.groups:
            refused = [f"{fqn}: {why}" for fqn, p in plan.groups[g.name].precisions.items()
                       if (why := precision_refusal(g.device_spec, p)) is not None]
            if refused:
                raise RuntimeSetupError(
                    f"plan group {g.name!r} asks for precisions its device {g.device_spec.name} cannot run:\n  - "
                    + "\n  - ".join(refused[:10]) + ("\n  - ..." if len(refused) > 10 else "")
                    + f"\nre-solve the plan for this spec (the solver only offers {list(g.allowed_precisions)})")
            apply_plan(model, plan, g.name, dry_run=True, force=force, op_kernels=plan.groups[g.name].kernels)

    check_data(spec)  # the data loads and fits the model: a bad data section exits 2 before any rank starts
    return batches


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


def run_job(spec, plan=None, *, nproc: int | None = None, steps: int | None = None,
            checkpoint_dir: str | None = None, checkpoint_every: int = 10, resume: bool = False,
            threads: int | None = None, metrics_dir: str | None = None, timeout_s: float | None = None,
            start_timeout_s: float | None = None, force: bool = False, logs_to_stderr: bool = False,
            emulate: bool = False, on_metrics_dir: Callable[[Path], None] | None = None) -> JobResult:
    """Validate, spawn one process per rank, watch them, and read back the metrics.

    `spec` is a path or a JobSpec; `plan` a path, a Plan, or None (every group in fp32).
    `threads` per rank defaults to the CPU count divided by the world size. `start_timeout_s`
    (default START_TIMEOUT_S) bounds process start-up and the rendezvous; `force` applies a
    plan whose graph fingerprint differs from the model's; `logs_to_stderr` sends the ranks'
    log lines to stderr (for `train --json`, whose stdout carries the result alone).

    Refusals that need no work come first (`check_job`: the plan against the spec; then the
    emulation check: groups whose device is not here are announced on stderr and, where
    emulation would be more than 10x slower, refused unless `emulate`, runtime/emulation.py),
    then the model dry run and the data check (`validate`). Only then is the metrics folder
    made, and `on_metrics_dir` called with it. A `Stopped` (the caller's `stop_on_signals`)
    raised after that leaves result.json saying "stopped" there, and propagates.
    """
    paths = import_paths(None if isinstance(spec, JobSpec) else spec)  # user code beside the spec, or in the cwd
    add_to_sys_path(paths)
    plan_name = "the plan" if plan is None or isinstance(plan, Plan) else f"--plan {plan}"
    spec = spec if isinstance(spec, JobSpec) else load_spec(spec)
    plan = plan if (plan is None or isinstance(plan, Plan)) else Plan.load(plan)
    check_job(spec, plan, nproc, plan_name=plan_name)

    emulated = check_emulation(spec, plan, emulate=emulate, log=lambda s: print(s, file=sys.stderr, flush=True))
    if resume and not checkpoint_dir:
        raise RuntimeSetupError("resume=True needs checkpoint_dir (where the run saved its checkpoints)")
    choice = ckpt.require(checkpoint_dir) if resume else None
    validate(spec, plan, nproc, force=force, plan_name=plan_name)
    world = spec.cluster.world_size
    steps = steps if steps is not None else spec.training.steps
    threads = threads or max(1, (os.cpu_count() or 1) // world)
    if choice is not None and choice.skipped:
        print(choice.describe(), file=sys.stderr)
    run_dir = Path(metrics_dir or (Path(checkpoint_dir) / "metrics" if checkpoint_dir else tempfile.mkdtemp(prefix="qsync-run-")))
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        if on_metrics_dir is not None:
            on_metrics_dir(run_dir)
        if emulated:  # reports read this: measured times here are the CPU's, not the devices'
            atomic_write_text(run_dir / "emulation.json", json.dumps([e.to_json() for e in emulated], indent=1) + "\n")
        else:
            (run_dir / "emulation.json").unlink(missing_ok=True)
        spec_file = atomic_write_text(run_dir / "spec.json", json.dumps(spec.model_dump(mode="json", by_alias=True)))
        argv = [sys.executable, "-m", "qsync_opt.training.runtime.worker", str(spec_file), "--steps", str(steps),
                "--metrics-dir", str(run_dir), "--threads", str(threads)]
        if plan is not None:
            argv += ["--plan", str(plan.save(run_dir / "plan.json"))]
        if checkpoint_dir:
            argv += ["--checkpoint-dir", str(checkpoint_dir), "--checkpoint-every", str(checkpoint_every)]
        if choice is not None:
            argv += ["--resume", "--resume-from", str(choice.path)]
        if force:
            argv.append("--force")
        envs = [with_pythonpath(env, paths) for env in rank_envs(spec, threads, free_port())]
        ready_dir = Path(tempfile.mkdtemp(prefix="qsync-ready-"))
        for r, env in enumerate(envs):
            env["QSYNC_READY_FILE"] = str(ready_dir / f"rank{r}")
        offsets = {r: _size(run_dir / f"rank{r}.jsonl") if resume else 0 for r in range(world)}
        try:
            spawned = spawn_ranks(argv, envs, timeout_s=timeout_s,
                                  start_timeout_s=START_TIMEOUT_S if start_timeout_s is None else start_timeout_s,
                                  stdout=2 if logs_to_stderr else None)
        finally:
            shutil.rmtree(ready_dir, ignore_errors=True)
        result = _collect(spawned, run_dir, spec.training.global_batch, checkpoint_dir, offsets)
        atomic_write_text(run_dir / "result.json", json.dumps(result.summary(), indent=1) + "\n")
        return result
    except Stopped:
        stopped = {"status": "stopped", "exit_code": EXIT_STOPPED, "steps_done": 0, "failure": None,
                   "note": "stopped while the launcher prepared the run or read it back", "metrics_dir": str(run_dir),
                   "checkpoint_dir": checkpoint_dir}
        with contextlib.suppress(OSError, Stopped):  # a second stop while writing: the first one stands
            atomic_write_text(run_dir / "result.json", json.dumps(stopped, indent=1) + "\n")
        raise


START_TIMEOUT_S = float(os.environ.get("QSYNC_START_TIMEOUT_S", 120))
"""Default bound on process start-up plus rendezvous (torch import is slow on a loaded machine)."""


RUNS_DIR = "qsync-runs"
"""Where `train` keeps metrics when given neither --metrics-dir nor --checkpoint-dir (in the cwd)."""


def default_metrics_dir(spec, metrics_dir: str | None, checkpoint_dir: str | None) -> str:
    """--metrics-dir; else beside the checkpoints (CKPT/metrics); else a named run folder
    ./qsync-runs/<spec name>-<UTC time>/, in the working directory."""
    if metrics_dir:
        return str(metrics_dir)
    if checkpoint_dir:
        return str(Path(checkpoint_dir) / "metrics")
    import time

    name = (spec if isinstance(spec, JobSpec) else load_spec(spec)).name
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    run = Path(RUNS_DIR) / f"{name}-{stamp}"
    k = 1
    while run.exists():
        k += 1
        run = Path(RUNS_DIR) / f"{name}-{stamp}-{k}"
    return str(run)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _collect(spawned: Spawned, run_dir: Path, global_batch: int, checkpoint_dir, offsets: dict[int, int]) -> JobResult:
    """Read the ranks' metrics; events count only from this attempt (bytes after `offsets`)."""
    per_rank, stopped = {}, False
    for r in range(len(spawned.codes)):
        f = run_dir / f"rank{r}.jsonl"
        data = f.read_bytes() if f.exists() else b""
        records = _records(data)
        stopped |= any(x.get("event") == "stopped" for x in _records(data[offsets.get(r, 0):]))
        by_step = {x["step"]: x for x in records if "loss" in x}  # a resumed run re-logs steps after its checkpoint
        per_rank[r] = [by_step[s] for s in sorted(by_step)]
    rank0 = per_rank.get(0, [])
    step_ms = {r: sum(x["step_ms"] for x in recs) / len(recs) for r, recs in per_rank.items() if recs}
    slowest = max(step_ms.values(), default=0.0)
    return JobResult(
        returncodes=spawned.codes,
        steps_done=rank0[-1]["step"] if rank0 else 0,
        losses=[x["loss"] for x in rank0],
        step_ms=step_ms,
        samples_per_s=global_batch / (slowest / 1e3) if slowest else 0.0,
        metrics_dir=str(run_dir),
        checkpoint_dir=checkpoint_dir,
        stopped=(stopped or spawned.signalled) and spawned.failure is None,
        per_rank=per_rank,
        failure=spawned.failure,
        failed_code=spawned.failed_code,
        wall_s=spawned.wall_s,
        killed_after_grace=spawned.killed_after_grace,
        stop_signal=spawned.stop_signal,
    )


def _records(data: bytes) -> list[dict]:
    out = []
    for line in data.decode(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line cut by a kill -9
            continue
    return out


def launch(spec_path, plan_path=None, *, nproc: int | None = None, steps: int | None = None,
           checkpoint_dir: str | None = None, resume: bool = False, checkpoint_every: int = 10,
           threads: int | None = None, metrics_dir: str | None = None, start_timeout_s: float | None = None,
           force: bool = False, as_json: bool = False, emulate: bool = False) -> int:
    """`qsync-opt train`: run the job and print a summary; returns the exit code.

    0 completed, EXIT_STOPPED (4) stopped by a signal after checkpointing, 2 a rank refused
    its input, 1 any other failure. With `as_json` the result alone goes to stdout.
    """
    out = sys.stderr if as_json else sys.stdout

    def announce(d: Path) -> None:  # only once the folder exists: a refused run names no folder
        print(f"metrics: {d} (rank<r>.jsonl, result.json)", file=out, flush=True)

    try:
        with stop_on_signals():
            metrics_dir = default_metrics_dir(spec_path, metrics_dir, checkpoint_dir)
            result = run_job(spec_path, plan_path, nproc=nproc, steps=steps, checkpoint_dir=checkpoint_dir,
                             checkpoint_every=checkpoint_every, resume=resume, threads=threads, metrics_dir=metrics_dir,
                             start_timeout_s=start_timeout_s, force=force, logs_to_stderr=as_json, emulate=emulate,
                             on_metrics_dir=announce)
    except Stopped as e:
        print(f"stopped by {e.signal} before any rank started (exit code {EXIT_STOPPED}); nothing was trained"
              + (f"; continue with --resume --checkpoint-dir {checkpoint_dir}" if resume else ""), file=out)
        if as_json:
            sys.stdout.write(json.dumps({"status": "stopped", "exit_code": EXIT_STOPPED, "steps_done": 0,
                                         "failure": None}, indent=1) + "\n")
        return EXIT_STOPPED
    if result.failure is None and result.losses:
        print(f"trained {result.steps_done} steps: loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}, "
              f"{result.samples_per_s:.0f} samples/s; per-rank mean step ms "
              + ", ".join(f"{r}: {ms:.1f}" for r, ms in result.step_ms.items())
              + f"; metrics in {result.metrics_dir}", file=out)

        if evals := read_eval(result.metrics_dir):
            last = evals[-1]
            ppl = f", perplexity {last['test_perplexity']:.3f}" if last.get("test_perplexity") is not None else ""
            print(f"test set after step {last['step']}: accuracy {last['test_accuracy']:.4f}, loss {last['test_loss']:.4f}{ppl} "
                  f"({last['test_samples']} {'test tokens' if ppl else 'samples'}); eval.csv in {result.metrics_dir}",
                  file=out)
    if result.status == "stopped":
        if result.killed_after_grace:
            print("the ranks had not finished their step when the stop's grace period ended and were killed; "
                  "that step is lost", file=out)
        when = f"after step {result.steps_done}" if result.steps_done else "before the first step ended"
        print(f"stopped on a signal {when} (exit code {EXIT_STOPPED})"
              + (f"; continue with --resume --checkpoint-dir {checkpoint_dir}" if checkpoint_dir else ""), file=out)
    if result.status == "failed":
        print(f"training failed: {result.failure}\nmetrics in {result.metrics_dir}", file=sys.stderr)
    if as_json:
        sys.stdout.write(json.dumps(result.summary(), indent=1) + "\n")
    return result.exit_code
