"""`qsync-opt profile` for training: the parent that starts the measuring processes (profiler.py) and merges their
profiles.

It imports no torch: the measuring processes start as soon as the spec is read, instead of after a second or
more of this process's own imports, and the merge after them is a JSON read and write. The measuring itself (the
runtime's kernels, whole steps, the DDP step and the all-reduce) runs in those processes, each with its group's env.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from qsync_opt.errors import SpecError
from qsync_opt.io import entry_lock
from qsync_opt.training.predictor.colocate import rank_jobs, run_colocated
from qsync_opt.training.predictor.measuring import ddp_key, gpu_not_profiled, group_threads, is_local, local_ranks
from qsync_opt.training.predictor.profile import Profile, ProfileError, load_profile, runtime_tag, section_key
from qsync_opt.training.spec import JobSpec, load_spec


def profile_spec(spec_or_path, path: "str | Path", *, groups: list[str] | None = None,
                 allreduce: bool = True, progress: bool = True, log=print) -> Profile:
    """Profile every group of the spec whose device runs here, each in a subprocess with its env.

    One profiling run per profile file at a time (io.entry_lock): two at once would each time
    the other's load into its own figures, and the later save would drop the earlier's sections.
    A run that waited resumes what the first one measured instead of measuring it again."""

    spec = load_spec(spec_or_path)
    names = [g.name for g in spec.cluster.groups]
    unknown = [n for n in groups or () if n not in names]
    if unknown:  # before the lock: a wrong name leaves nothing beside the profile
        raise SpecError(f"profile --groups: {unknown[0]!r} is not in cluster.groups ({', '.join(names)})")
    local = [g for g in spec.cluster.groups if is_local(g.device_spec) and (groups is None or g.name in groups)]
    for g in local:  # a measured status must be a measurement of that device, as that rank runs
        if (why := gpu_not_profiled(spec, g)) is not None:
            raise ProfileError(f"profile: group {g.name} runs on a GPU: {why}; price it by the roofline (costs: auto "
                               "does; calibrated where docs/gpu.md has factors for the device), or profile it from "
                               "a spec in which its rank is this machine's only one")
    if not local:
        asked = [g for g in spec.cluster.groups if groups is None or g.name in groups]
        raise SpecError("profile: no group asked for runs on this machine's device ("
                        + ", ".join(f"{g.name}: {g.device_spec.name}" for g in asked)
                        + "); nothing to measure here: profile on a machine with that device and give the group its "
                          "file (cluster.groups[].profile)")
    if Path(path).is_dir():
        load_profile(path)  # refuses it, naming the folder: before the lock, which would sit beside the folder
    src = spec_or_path if isinstance(spec_or_path, (str, Path)) else None
    with entry_lock(path, on_wait=lambda: log(f"waiting: another process is profiling into {path}")):
        return _profile_spec(spec, src, local, path, allreduce=allreduce, progress=progress, log=log)


def _profile_spec(spec: JobSpec, src, local: list, path, *, allreduce, progress, log) -> Profile:
    seen, profile = set(), []
    for g in local:
        key = (tuple(sorted(g.env.items())), group_threads(g, spec.cluster.world_size), spec.local_batches()[g.name])
        if key not in seen:
            seen.add(key)
            profile.append(g)
    here = [g for g in spec.cluster.groups if is_local(g.device_spec)]
    world = spec.cluster.world_size

    before = load_profile(path) if Path(path).exists() else None
    every_rank_here = world > 1 and local_ranks(spec) == world
    want_ar = allreduce and world > 1 and (before is None or f"gloo/{world}" not in before.allreduce)
    want_ddp = allreduce and every_rank_here and (before is None or ddp_key(spec) not in before.allreduce)
    ar_fit = ddp_ms = None
    if local_ranks(spec) > 1:  # ranks train at once here: time them so (colocate.py)

        for g in profile:
            log(f"profiling group {g.name} (device {g.device_spec.name}, env {g.env or '{}'})")
        jobs = rank_jobs(here, profile)
        log(f"co-located: {len(jobs)} processes at once, one per local rank"
            + ("; first, in them, one fp32 DDP step over every rank, fresh as train starts them" if want_ddp else "")
            + ("; then, in them, the gloo all-reduce" if want_ar and every_rank_here else ""))
        ar_fit, ddp_ms = run_colocated(spec, jobs, Path(path), progress,
                                       lambda g: section_key(g.env, group_threads(g, world), local_ranks(spec),
                                                                        runtime_tag(spec.runtime)),
                                       allreduce=want_ar and every_rank_here, ddp=want_ddp)
    else:
        for g in profile:
            log(f"profiling group {g.name} (device {g.device_spec.name}, env {g.env or '{}'})")
            _run_group_subprocess(spec, src, g, path, progress)
    prof = load_profile(path)
    if want_ar:
        if ar_fit is None:
            log(f"profiling gloo all-reduce over {world} local processes")
            from qsync_opt.training.predictor.allreduce_profile import measure_allreduce  # import cost: torch

            ar_fit = measure_allreduce(world)
        prof.allreduce[f"gloo/{world}"] = ar_fit
    if want_ddp:  # every rank here, so the co-located processes took it (colocate.run_colocated)
        if ddp_ms is None:
            raise ProfileError("profiler: the co-located ranks wrote no fp32 DDP step; see the messages above")
        prof.allreduce[ddp_key(spec)] = {"fp32_ms": ddp_ms}
    prof.save(path)
    return prof


def _run_group_subprocess(spec: JobSpec, src, g, path, progress: bool) -> None:
    import json
    import tempfile

    env = {**os.environ, "OMP_NUM_THREADS": str(group_threads(g, spec.cluster.world_size)), **g.env}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec.model_dump(mode="json", by_alias=True), f)
        spec_file = f.name
    try:
        argv = [sys.executable, "-m", "qsync_opt.training.predictor.profiler", spec_file, g.name, str(path)]
        if not progress:
            argv.append("--quiet")
        r = subprocess.run(argv, env=env)
    finally:
        os.unlink(spec_file)
    if r.returncode != 0:
        raise ProfileError(f"profiler: group {g.name!r} failed (exit {r.returncode}); see the messages above")
