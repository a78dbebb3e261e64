"""One rank of synchronous data-parallel training: build, apply the group's plan, wrap in DDP, train.

Local batches may differ between groups. DDP averages gradients over ranks, so each rank
scales its mean loss by local_batch * world / global_batch before backward: the average of
the scaled gradients is then exactly the gradient of the mean loss over the global batch.
The loss that is logged is that global-batch mean (one extra scalar all-reduce per step),
which also carries the stop flag so every rank leaves the loop after the same step.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from qsync_opt.errors import KernelBuildError, RuntimeSetupError, SpecError
from qsync_opt.training.plan import Plan
from qsync_opt.training.spec import JobSpec, TrainingSpec
from qsync_opt.runtime import checkpoint as ckpt
from qsync_opt.runtime.apply import apply_plan, current_precisions
from qsync_opt.data.evaluation import Evaluator
from qsync_opt.models.rewrite import applicable_model
from qsync_opt.runtime.data import SyntheticTask, build_model, build_task, shard


def loss_weight(local_batch: int, world: int, global_batch: int) -> float:
    """Factor on a rank's mean loss so that DDP's average over ranks is the global-batch mean."""
    return local_batch * world / global_batch


def rank_batches(spec: JobSpec, plan: Plan | None) -> list[int]:
    """Local batch of every rank in rank order: the plan's choice, else the spec's."""
    per_group = {name: g.local_batch for name, g in plan.groups.items()} if plan else spec.local_batches()
    return [per_group[g.name] for g in spec.cluster.groups for _ in range(g.count)]


def make_optimizer(training: TrainingSpec, params) -> torch.optim.Optimizer:
    lr = training.lr
    if training.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if training.optimizer == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if training.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr)


def check_backward_precision(spec: JobSpec, plan: Plan) -> None:
    """Refuse a plan costed for another runtime.backward_precision than the spec runs (its times would not hold);
    a plan that does not record it (hand-written, or older) is not checked."""
    want, got = plan.backward_precision, spec.runtime.backward_precision
    if want not in (None, got):
        raise RuntimeSetupError(
            f"plan for job {plan.job!r} was costed for runtime.backward_precision={want!r}, but the spec runs "
            f"{got!r}, under which its times do not hold; re-solve the spec (`qsync-opt solve SPEC -o plan.json`) "
            f"or set runtime.backward_precision: {want}")


def build_rank_model(spec: JobSpec, plan: Plan | None, group: str, force: bool = False) -> nn.Module:
    """The model with identical initial weights on every rank, and `group`'s plan applied."""
    torch.manual_seed(spec.training.seed)
    model = build_model(spec)
    if plan is not None:
        rt = spec.runtime
        check_backward_precision(spec, plan)
        model = applicable_model(model, spec, plan)  # functional GEMMs the plan names get their modules
        model = apply_plan(model, plan, group, kernels=rt.kernels, weight_granularity=rt.weight_granularity,
                           backward_precision=rt.backward_precision, rounding=rt.rounding, force=force,
                           op_kernels=plan.groups[group].kernels if group in plan.groups else None,
                           device=next(g for g in spec.cluster.groups if g.name == group).device_spec)
    return model


def forward_backward(model: nn.Module, task: SyntheticTask, inputs, targets, weight: float) -> torch.Tensor:
    """Forward, loss, weighted backward (DDP all-reduces during backward); returns the local mean loss."""
    loss = task.loss(model(*inputs), targets)
    (loss * weight).backward()
    return loss.detach()


@dataclass
class WorkerConfig:
    spec: JobSpec
    plan: Plan | None
    steps: int
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    metrics_dir: str | None = None
    threads: int = 1
    resume_from: str | None = None
    """Checkpoint directory the launcher chose (None: rank 0 chooses the newest valid one)."""
    force: bool = False
    """Apply the plan even when its graph fingerprint differs from the model's."""


# EXIT_STOPPED (4): a rank (and `qsync-opt train`) stopped by SIGTERM/SIGINT after checkpointing
from qsync_opt.runtime.process_exit import EXIT_STOPPED  # noqa: E402,F401 (re-exported)

COLLECTIVE_TIMEOUT_S = float(os.environ.get("QSYNC_COLLECTIVE_TIMEOUT_S", 1800))
"""How long a collective waits for a peer before gloo/NCCL raises instead of hanging for ever."""


def env_threads(default: int) -> int:
    """OMP_NUM_THREADS as a positive int (a group's env may set fewer threads: a slower device)."""
    raw = os.environ.get("OMP_NUM_THREADS")
    if raw is None or raw == "":
        return default
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise SpecError(f"environment OMP_NUM_THREADS={raw!r} is not a positive integer; "
                        "set the group's env OMP_NUM_THREADS to e.g. \"2\", or remove it")
    return n


class _StopFlag:
    """Set by SIGTERM/SIGINT; the step in progress finishes, then every rank stops together.

    Until this attempt's first step has ended (`stepped` false: start-up, rendezvous, kernel
    build, the first step) there is nothing new to save, so a stop ends the rank at once with
    EXIT_STOPPED: waiting for a first step that may take minutes would only get the rank killed
    at the end of the launcher's grace period."""

    def __init__(self):
        self.set = False
        self.stepped = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.set = True
        if not self.stepped:
            sys.stderr.write(f"rank {os.environ.get('RANK', '?')}: stopped by {signal.Signals(signum).name} "
                             "before its first step ended (nothing new to checkpoint)\n")
            sys.stderr.flush()
            os._exit(EXIT_STOPPED)


def run_worker(cfg: WorkerConfig) -> int:
    """Train this rank (RANK/WORLD_SIZE/MASTER_* from the environment).

    Returns 0 on completion, EXIT_STOPPED after a signal-requested stop.
    """
    stop = _StopFlag()
    torch.set_num_threads(env_threads(cfg.threads))
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    use_cuda = torch.cuda.is_available() and os.environ.get("QSYNC_DEVICE", "auto") != "cpu"
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        ready = os.environ.get("QSYNC_READY_FILE")
        if ready:  # the launcher's start-up watchdog: this rank is past the rendezvous
            Path(ready).touch()
        try:
            code = _train(cfg, rank, world, stop, use_cuda)
            dist.barrier()  # nobody tears down its connections while another rank still uses them
        except (RuntimeError, dist.DistBackendError) as e:
            if not stop.set:
                raise
            # a peer stopped at once (before its first step ended) while this rank was in a collective
            sys.stderr.write(f"rank {rank}: stopped (a peer ended on the same stop: {str(e).splitlines()[0][:200]})\n")
            return EXIT_STOPPED
        return code
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _env_int(name: str) -> int:
    raw = os.environ.get(name)
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise SpecError(f"environment {name}={raw!r}: expected an integer; start ranks with `qsync-opt train` "
                        "or torchrun, which set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT") from None


def _train(cfg: WorkerConfig, rank: int, world: int, stop: _StopFlag, use_cuda: bool) -> int:
    spec, plan = cfg.spec, cfg.plan
    group = os.environ.get("QSYNC_GROUP") or spec.cluster.group_of_rank(rank).name
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    batches = rank_batches(spec, plan)
    global_batch = sum(batches)
    offset, local = shard(batches, rank)
    weight = loss_weight(local, world, global_batch)

    model = build_rank_model(spec, plan, group, cfg.force).to(device)
    ddp = DDP(model, device_ids=[device.index] if use_cuda else None)
    optimizer = make_optimizer(spec.training, model.parameters())
    task = build_task(spec)
    torch.manual_seed(spec.training.seed * 7_919 + 1 + rank)  # per-rank stream: dropout, stochastic rounding
    meta = {"world_size": world, "local_batches": batches, "model": spec.model.name or spec.model.import_}

    start, plane_record = 0, None
    if cfg.resume:
        state, rng = ckpt.load(cfg.checkpoint_dir, rank, expect_meta=meta, path=_resume_dir(cfg, rank))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if rng is not None:
            ckpt.set_rng_state(rng)
        start = state["step"]
        plane_record = state.get("data_plane")

    metrics = _Metrics(cfg.metrics_dir, rank, group, resume=cfg.resume)
    feed = None
    if spec.data is not None and spec.data.sources:  # variable-length samples through the data plane
        from qsync_opt.training.runtime.plane_feed import PlaneFeed  # import cost: the data plane (loading/), for data.sources only

        feed = PlaneFeed(spec, plan, rank, world, global_batch, device, checkpoint_dir=cfg.checkpoint_dir,
                         metrics_dir=cfg.metrics_dir, note=metrics.note)
        feed.resume(plane_record, start, cfg.resume)
    evaluator = Evaluator(spec, task, cfg.metrics_dir, rank, resume=cfg.resume, total_steps=cfg.steps)
    counts = _counts(current_precisions(model))
    metrics.note(f"rank {rank}/{world} group={group} local_batch={local} threads={torch.get_num_threads()} "
                 f"precisions={counts} start_step={start}", event="start", rank=rank, group=group,
                 local_batch=local, threads=torch.get_num_threads(), precisions=counts, start_step=start,
                 env={k: os.environ.get(k) for k in spec.cluster.group_of_rank(rank).env})
    if not use_cuda:
        prepare_kernels(spec.runtime.kernels, counts, metrics.note)
    step = start
    while step < cfg.steps:
        t0 = time.perf_counter()  # the whole iteration, this rank's data included: what the planner predicts
        optimizer.zero_grad(set_to_none=True)
        if feed is None:
            inputs, targets = task.batch(step, global_batch, offset, local)
            inputs = tuple(t.to(device) for t in inputs)
            targets = targets.to(device)
            local_loss = forward_backward(ddp, task, inputs, targets, weight)
            contribution, denominator, n_local, extra = local_loss.float() * local, global_batch, local, {}
        else:  # this rank's sample ids from the coordinator; loss over the global token count
            loss_sum, denominator, extra = feed.step(ddp, step)
            n_local = extra["samples"]
            local_loss = loss_sum / max(extra["tokens"] - n_local, 1)
            contribution = loss_sum.float()
        optimizer.step()
        # one scalar all-reduce: the global-batch loss and whether any rank was asked to stop
        summary = torch.stack([contribution, torch.tensor(float(stop.set), device=device)])
        dist.all_reduce(summary)
        if use_cuda:
            torch.cuda.synchronize()
        step_s = time.perf_counter() - t0
        stop.stepped = True  # from here a stop finishes the step and checkpoints
        step += 1
        metrics.step(step, summary[0].item() / denominator, local_loss.item(), step_s, n_local, **extra)
        stopping = summary[1].item() > 0
        if (ev := evaluator.after_step(step, summary[0].item() / denominator, model)) is not None:
            metrics.note(f"eval step {step} test_loss {ev['test_loss']:.4f} test_accuracy {ev['test_accuracy']:.4f}"
                         + (f" test_perplexity {ev['test_perplexity']:.3f}" if "test_perplexity" in ev else ""))
        due = cfg.checkpoint_every and step % cfg.checkpoint_every == 0
        if cfg.checkpoint_dir and (due or stopping or step == cfg.steps):
            record = feed.checkpoint_record(step) if feed is not None else None
            _checkpoint(cfg.checkpoint_dir, step, rank, model, optimizer, meta,
                        extra=None if record is None else {"data_plane": record})
            if feed is not None:
                feed.after_publish()
        if stopping:
            metrics.note(f"stopped on signal after step {step}", event="stopped", step=step)
            metrics.close()
            if feed is not None:
                feed.close()
            return EXIT_STOPPED
    metrics.note(f"completed {step} steps", event="completed", step=step)
    metrics.close()
    if feed is not None:
        feed.close()
    return 0


def _resume_dir(cfg: WorkerConfig, rank: int) -> str:
    """The checkpoint every rank resumes from: the launcher's choice, else rank 0's, broadcast."""
    if cfg.resume_from:
        return cfg.resume_from
    choice = [None]
    if rank == 0:
        try:
            c = ckpt.require(cfg.checkpoint_dir)
            if c.skipped:
                sys.stderr.write(c.describe() + "\n")
            choice = [str(c.path)]
        except Exception as e:  # every rank must leave the broadcast, then fail with the same message
            choice = [f"!{e}"]
    dist.broadcast_object_list(choice, src=0)
    if choice[0].startswith("!"):
        raise RuntimeSetupError(choice[0][1:])
    return choice[0]


def prepare_kernels(kernels: str, counts: dict[str, int], note) -> None:
    """Build (first use) or load the templated CPU kernels before step 1, saying so and how long.

    Otherwise the first step silently compiles for minutes and its step time is meaningless.
    """
    if kernels == "torch" or not any(p in counts for p in ("int8", "int4", "fp8_e4m3", "fp8_e5m2")):
        return

    note("preparing the templated CPU kernels (compiled on first use, then cached; can take minutes)")
    t0 = time.perf_counter()
    try:
        from qsync_opt.kernels.registry import get_cpu_module  # import cost: the kernel build stack (jinja2 templates)

        mod = get_cpu_module()
    except KernelBuildError as e:
        if kernels == "templated":
            raise
        note(f"templated kernels unavailable after {time.perf_counter() - t0:.1f} s, using the torch path: "
             f"{str(e).splitlines()[0]}")
        return
    how = "built" if mod.built else "loaded from cache"
    note(f"templated kernels {how} in {time.perf_counter() - t0:.1f} s", event="kernels", built=mod.built,
         seconds=round(time.perf_counter() - t0, 3))


def _checkpoint(root, step, rank, model, optimizer, meta, extra=None):
    if rank == 0:
        state = master_state(model)
        sums = ckpt.save_rank_files(root, step, rank, model_state=state, optimizer_state=optimizer.state_dict(),
                                    meta=meta, extra=extra)
    else:
        sums = ckpt.save_rank_files(root, step, rank)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sums)  # also the barrier: every rank has written its files
    if rank == 0:
        ckpt.publish(root, step, {k: v for part in gathered for k, v in part.items()})
    dist.barrier()


def master_state(model: nn.Module) -> dict:
    """The fp32 master weights under plain FQNs (quantized modules keep the original names)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _counts(precisions: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in precisions.values():
        out[p] = out.get(p, 0) + 1
    return out


class _Metrics:
    """Plain log lines on stdout and a JSON line per step in metrics_dir/rank<r>.jsonl."""

    def __init__(self, metrics_dir, rank, group, resume):
        self.rank, self.group = rank, group
        self.file = None
        if metrics_dir:
            Path(metrics_dir).mkdir(parents=True, exist_ok=True)
            self.file = open(Path(metrics_dir) / f"rank{rank}.jsonl", "a" if resume else "w")

    def note(self, text, event: str | None = None, **fields):
        sys.stdout.write(f"[rank {self.rank} {self.group}] {text}\n")  # one write: lines of ranks never interleave
        sys.stdout.flush()
        if event and self.file:
            self.file.write(json.dumps({"event": event, **fields}) + "\n")
            self.file.flush()

    def step(self, step, loss, local_loss, step_s, local_batch, **extra):
        rec = {"step": step, "loss": loss, "local_loss": local_loss, "step_ms": step_s * 1e3,
               "samples_per_s": local_batch / step_s if step_s > 0 else None, "group": self.group, **extra}
        self.note(f"step {step} loss {loss:.6f} step_ms {rec['step_ms']:.1f} samples/s {rec['samples_per_s']:.0f}")
        if self.file:
            self.file.write(json.dumps(rec) + "\n")
            self.file.flush()

    def close(self):
        if self.file:
            self.file.close()
