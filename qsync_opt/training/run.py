"""`qsync-opt run SPEC -o DIR`: the whole loop in one command, each stage's artefact cached in DIR.

Stages, in order (`STAGES`): profile -> indicate -> solve -> predict -> train -> report.
Each writes its artefact into DIR and records the spec digest in DIR/run.json; a later run
reuses every artefact made from the same spec and restarts at the first stage that is
missing, or at `--from STAGE` (that stage and every later one run again). A stage is
`fn(ctx) -> artefact path`; profile, indicate and predict live in training/run_stages.py.

`profile` measures only groups whose device runs here and whose costs may be measured
(`costs:` not roofline, no `profile:` file) and that this machine's profile lacks; `solve`
then reads the same profile and indicator caches, so it does not measure again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qsync_opt.errors import QSyncError, SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.training.plan import Plan
from qsync_opt.spec.load import read_document
from qsync_opt.training.spec import JobSpec, load_spec


@dataclass
class RunContext:
    spec_path: str
    spec: JobSpec
    out: Path
    steps: int | None = None
    log: Callable[[str], None] = print
    emulate: bool = False
    artefacts: dict[str, str] = field(default_factory=dict)


def _profile(ctx: RunContext) -> str:
    from qsync_opt.training.run_stages import profile_stage

    return profile_stage(ctx.spec, ctx.out, ctx.log)


def _indicate(ctx: RunContext) -> str:
    from qsync_opt.training.run_stages import indicate_stage

    return indicate_stage(ctx.spec, ctx.out, ctx.log)


def _solve(ctx: RunContext) -> str:
    from qsync_opt.training.data_plane import with_data_plane
    from qsync_opt.training.pipeline import solve

    plan = with_data_plane(ctx.spec, solve(ctx.spec))
    return str(plan.save(ctx.out / "plan.json"))


def _train(ctx: RunContext) -> str:
    from qsync_opt.training.runtime.launch import run_job

    metrics = ctx.out / "train"
    before = os.getloadavg()
    result = run_job(ctx.spec_path, Plan.load(ctx.out / "plan.json"), steps=ctx.steps, metrics_dir=str(metrics),
                     emulate=ctx.emulate)
    if not result.ok:
        raise QSyncError(f"training failed: exit codes by rank {result.returncodes}; logs in {metrics}")
    # the report sets measured step times beside the machine load they were taken under
    atomic_write_text(metrics / "load.json", json.dumps({"before": before, "after": os.getloadavg()}))
    return str(metrics)


def _predict(ctx: RunContext) -> str:
    from qsync_opt.training.run_stages import predict_stage

    return predict_stage(ctx.spec_path, ctx.out, ctx.log)


def _report(ctx: RunContext) -> str:
    from qsync_opt.training.run_report import write_report

    return str(write_report(ctx.spec, Plan.load(ctx.out / "plan.json"), ctx.out / "train", ctx.out))


STAGES: dict[str, Callable[[RunContext], str]] = {"profile": _profile, "indicate": _indicate, "solve": _solve,
                                                  "predict": _predict, "train": _train, "report": _report}


def run(spec_path: str, out: "str | Path", *, start: str | None = None, steps: int | None = None,
        log: Callable[[str], None] = print, emulate: bool = False) -> dict[str, str]:
    """Run the stages from the first one without a cached artefact (or from `start`); returns stage -> artefact."""
    if start is not None and start not in STAGES:
        raise SpecError(f"--from {start!r}: not a stage; stages are {', '.join(STAGES)}")
    kind = read_document(spec_path)[0].get("kind", "training")
    if kind != "training":
        raise SpecError(f"kind: {kind}: `qsync-opt run` profiles, plans and trains a training job; "
                        f"plan a {kind} spec with `qsync-opt solve`")
    spec = load_spec(spec_path)
    from qsync_opt.runtime.emulation import check_emulation

    check_emulation(spec, None, emulate=emulate, log=log)  # refuse a >10x emulation before profiling and solving
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "run.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    if manifest.get("spec_digest") != spec.digest() or manifest.get("steps") != steps:
        manifest = {"spec_digest": spec.digest(), "steps": steps, "stages": {}}
    from qsync_opt.data.imported import add_to_sys_path, import_paths

    add_to_sys_path(import_paths(spec_path))  # user models, for every stage that builds the model
    ctx = RunContext(spec_path, spec, out, steps, log, emulate)
    rerun = False
    for name, fn in STAGES.items():
        rerun = rerun or name == start or name not in manifest["stages"] or not Path(manifest["stages"][name]).exists()
        if not rerun:
            log(f"[{name}] cached: {manifest['stages'][name]}")
            continue
        log(f"[{name}] running")
        manifest["stages"][name] = fn(ctx)
        atomic_write_text(manifest_path, json.dumps(manifest, indent=1))
        log(f"[{name}] wrote {manifest['stages'][name]}")
    return dict(manifest["stages"])
