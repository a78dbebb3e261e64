"""`qsync-opt run SPEC -o DIR`: the whole loop in one command, each stage's artefact cached in DIR.

Stages, in order (`STAGES`): profile -> indicate -> solve -> predict -> train -> report.
Each writes its artefact into DIR and records the spec digest in DIR/run.json; a later run
reuses every artefact made from the same spec and restarts at the first stage that is
missing, or at `--from STAGE` (that stage and every later one run again). A stage is
`fn(ctx) -> artefact path`; profile, indicate and predict live in training/run_stages.py.

run.json's `status` is running, completed, failed or stopped (with the stage). A stop
(SIGTERM/SIGINT, `stop_on_signals`) during any stage raises `Stopped` naming the stage and the
command that continues; run.json then records `status: stopped` and lists only the stages that
finished (a stage and every later one are struck from it before the stage runs),
and report.md says the run stopped. Training keeps checkpoints in DIR/checkpoints: the next
run with the same arguments reuses the finished stages and resumes training from the newest
checkpoint the stopped one wrote, training only the remaining steps.

`profile` measures only groups whose device runs here and whose costs may be measured
(`costs:` not roofline, no `profile:` file) and that this machine's profile lacks; `solve`
then reads the same profile and indicator caches, so it does not measure again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qsync_opt.errors import QSyncError, SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.runtime.process_exit import Stopped, stop_on_signals
from qsync_opt.solver.budget import Budget
from qsync_opt.training.plan import Plan
from qsync_opt.spec.load import read_document
from qsync_opt.training.spec import JobSpec, load_spec
from qsync_opt.data.imported import add_to_sys_path, import_paths
from qsync_opt.runtime import checkpoint as ckpt
from qsync_opt.runtime.emulation import check_emulation
from qsync_opt.training.pipeline import plan_job
from qsync_opt.training.run_report import write_report, write_stopped_report
from qsync_opt.training.run_stages import indicate_stage, predict_stage, profile_stage
from qsync_opt.training.runtime import launch


@dataclass
class RunContext:
    spec_path: str
    spec: JobSpec
    out: Path
    steps: int | None = None
    log: Callable[[str], None] = print
    emulate: bool = False
    artefacts: dict[str, str] = field(default_factory=dict)
    resume_train: bool = False
    """Continue the training a stopped run left in CHECKPOINTS (else start it afresh)."""


CHECKPOINTS = "checkpoints"
"""The training stage's checkpoint folder inside the run's output folder."""


def _profile(ctx: RunContext) -> str:
    return profile_stage(ctx.spec, ctx.out, ctx.log)


def _indicate(ctx: RunContext) -> str:
    return indicate_stage(ctx.spec, ctx.out, ctx.log)


def _solve(ctx: RunContext) -> str:
    plan = plan_job(ctx.spec, Budget(ctx.spec.solver.time_limit_s))
    return str(plan.save(ctx.out / "plan.json"))


def _train(ctx: RunContext) -> str:
    metrics, checkpoints = ctx.out / "train", ctx.out / CHECKPOINTS
    resume = ctx.resume_train and ckpt.latest(checkpoints) is not None
    if resume:
        ctx.log(f"  resuming the stopped training from {ckpt.latest(checkpoints)}")
    else:  # a fresh training: a stale newer checkpoint must never be resumed later
        shutil.rmtree(checkpoints, ignore_errors=True)
    before = os.getloadavg()
    result = launch.run_job(ctx.spec_path, Plan.load(ctx.out / "plan.json"), steps=ctx.steps, metrics_dir=str(metrics),
                     checkpoint_dir=str(checkpoints), resume=resume, emulate=ctx.emulate)
    if result.status == "stopped":
        kept = (f"training stopped after step {result.steps_done} (checkpoint {ckpt.latest(checkpoints)})"
                if ckpt.latest(checkpoints) is not None else "training stopped before its first step ended")
        raise Stopped(result.stop_signal or "a signal", detail=kept)
    if not result.ok:
        raise QSyncError(f"training failed: exit codes by rank {result.returncodes}; logs in {metrics}")
    # the report sets measured step times beside the machine load they were taken under
    atomic_write_text(metrics / "load.json", json.dumps({"before": before, "after": os.getloadavg()}))
    return str(metrics)


def _predict(ctx: RunContext) -> str:
    return predict_stage(ctx.spec_path, ctx.out, ctx.log)


def _report(ctx: RunContext) -> str:
    return str(write_report(ctx.spec, Plan.load(ctx.out / "plan.json"), ctx.out / "train", ctx.out))


STAGES: dict[str, Callable[[RunContext], str]] = {"profile": _profile, "indicate": _indicate, "solve": _solve,
                                                  "predict": _predict, "train": _train, "report": _report}


def run(spec_path: str, out: "str | Path", *, start: str | None = None, steps: int | None = None,
        log: Callable[[str], None] = print, emulate: bool = False) -> dict[str, str]:
    """Run the stages from the first one without a cached artefact (or from `start`); returns stage -> artefact.

    Raises `Stopped` (its message names the stage and the command that continues) when a
    SIGTERM/SIGINT stops the run; refusals that need no work (kind, --from, the emulation
    check) come before any stage runs."""
    with stop_on_signals():
        try:
            return _run(spec_path, Path(out), start, steps, log, emulate)
        except Stopped as e:
            if e.where is None:  # before the first stage ran: nothing in DIR changed
                raise Stopped(e.signal, "before any stage ran", f"nothing was recorded; continue with: "
                              f"{continue_command(spec_path, out, steps, emulate)}") from None
            raise


def continue_command(spec_path: str, out: "str | Path", steps: int | None, emulate: bool) -> str:
    """The `qsync-opt run` command line that continues a stopped run (the same arguments)."""
    argv = ["qsync-opt", "run", str(spec_path), "-o", str(out)]
    argv += ["--steps", str(steps)] if steps is not None else []
    argv += ["--emulate"] if emulate else []
    return shlex.join(argv)


def _run(spec_path: str, out: Path, start: str | None, steps: int | None, log: Callable[[str], None],
         emulate: bool) -> dict[str, str]:
    if start is not None and start not in STAGES:
        raise SpecError(f"--from {start!r}: not a stage; stages are {', '.join(STAGES)}")
    kind = read_document(spec_path)[0].get("kind", "training")
    if kind != "training":
        raise SpecError(f"kind: {kind}: `qsync-opt run` profiles, plans and trains a training job; "
                        f"plan a {kind} spec with `qsync-opt solve`")
    spec = load_spec(spec_path)

    check_emulation(spec, None, emulate=emulate, log=log)  # refuse a >10x emulation before profiling and solving
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "run.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if manifest.get("spec_digest") != spec.digest() or manifest.get("steps") != steps:
        manifest = {"spec_digest": spec.digest(), "steps": steps, "stages": {}}
    stopped_in = (manifest.get("stopped") or {}).get("stage")

    add_to_sys_path(import_paths(spec_path))  # user models, for every stage that builds the model
    ctx = RunContext(spec_path, spec, out, steps, log, emulate)
    rerun, order = False, list(STAGES)
    for name, fn in STAGES.items():
        first = not rerun
        rerun = rerun or name == start or name not in manifest["stages"] or not Path(manifest["stages"][name]).exists()
        if not rerun:
            log(f"[{name}] cached: {manifest['stages'][name]}")
            continue
        # training resumes only where a stopped training left off, with every earlier stage as it was
        ctx.resume_train = name == "train" and first and start != "train" and stopped_in == "train"
        try:
            log(f"[{name}] running")
            later = order[order.index(name):]
            manifest["stages"] = {k: v for k, v in manifest["stages"].items() if k not in later}
            manifest.update(status="running", stage=name)
            atomic_write_text(manifest_path, json.dumps(manifest, indent=1))  # not done until it finishes
            manifest["stages"][name] = fn(ctx)
            manifest.pop("stopped", None)
            if name == order[-1]:
                manifest["status"] = "completed"
                manifest.pop("stage", None)
            atomic_write_text(manifest_path, json.dumps(manifest, indent=1))
        except Stopped as e:
            manifest["stages"].pop(name, None)
            _record_stop(ctx, manifest, manifest_path, name, e)

            how = (" (training resumes from that checkpoint)" if name == "train" and ckpt.latest(out / CHECKPOINTS)
                   else f" (it reruns {name!r} and what follows)")
            raise Stopped(e.signal, f"during stage {name!r}",
                          (f"{e.detail}; " if e.detail else "")
                          + f"{manifest_path} records only the stages before {name!r} as done; continue with: "
                          + continue_command(spec_path, out, steps, emulate) + how) from None
        except Exception:
            manifest.update(status="failed", stage=name)  # the stage is already struck from the done ones
            atomic_write_text(manifest_path, json.dumps(manifest, indent=1))
            raise
        log(f"[{name}] wrote {manifest['stages'][name]}")
    return dict(manifest["stages"])


def _record_stop(ctx: RunContext, manifest: dict, manifest_path: Path, stage: str, e: Stopped) -> None:
    """run.json says the run stopped in `stage` and report.md says so too (a second stop while
    writing leaves what the first one wrote: the stage is already struck from run.json)."""

    manifest.update(status="stopped", stage=stage, stopped={"stage": stage, "signal": e.signal, "detail": e.detail})
    with contextlib.suppress(Stopped):
        atomic_write_text(manifest_path, json.dumps(manifest, indent=1))
        write_stopped_report(ctx.spec, ctx.out, stage=stage, signal=e.signal, detail=e.detail,
                             command=continue_command(ctx.spec_path, ctx.out, ctx.steps, ctx.emulate))
