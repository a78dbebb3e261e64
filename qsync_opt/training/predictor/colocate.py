"""Profile device groups co-located, the way their ranks train: all busy at once.

`qsync-opt train` runs every rank of a local cluster on this machine at the same time; on a
CPU they share cores, caches and memory bandwidth (and, on a shared machine, whatever else
runs). Timed one group at a time, each group's ops would run on an otherwise idle machine and
under-price the real step (docs/predictor.md has the measurement). So one process per local rank runs at
once: a profiling process per distinct section (group env, threads, local batch), and a
companion for every other rank, which only runs that group's whole fp32 training step. A
process that finishes keeps running that step until every profiler is done, so no group is
timed on a machine emptier than training will leave it. Each profiler writes its own part
file (concurrent writers would lose each other's entries), merged into the profile at the end.

When every rank of the cluster runs here, these processes are the cluster's ranks: before
profiling, while each is as fresh as a rank `train` starts (imported, nothing run), they take
the fp32 DDP step together; after it, the gloo all-reduce (allreduce_profile.collectives). One
round of process start-up for all three, not one more for the DDP step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from qsync_opt.training.predictor.profile import Profile, ProfileError, load_profile
from qsync_opt.training.predictor.collective_results import Collectives, read_results
from qsync_opt.training.predictor.measuring import group_threads

#: A companion stops after this long even if a profiler never reports (e.g. it was killed).
BUSY_LIMIT_S = 1800.0


def rank_jobs(local: list, profile: list) -> list[tuple[object, bool]]:
    """(group, profiles?) per local rank: one profiler per group in `profile`, companions for
    the other ranks of local groups (in rank order)."""
    todo = {g.name for g in profile}
    jobs = []
    for g in local:
        for _ in range(g.count):
            jobs.append((g, g.name in todo))
            todo.discard(g.name)
    return jobs


def run_colocated(spec, jobs: list[tuple[object, bool]], path: Path, progress: bool, key_of,
                  *, allreduce: bool = False, ddp: bool = False) -> Collectives:
    """Start every job's process at once, wait for all, merge the profilers' parts into `path`
    (`key_of(group)`: the section a group's profiler writes), and return what the processes
    timed together (None where not asked). With `ddp` or `allreduce`, jobs must be the
    cluster's ranks, in rank order. `ddp`: first of all, before any profiling, one fp32 DDP step
    (allreduce_profile.collectives), while the processes are as fresh as the ranks `train`
    starts: read in them after their profiling instead, it came out a median 8% below what
    `train` then measured (benchmarks/ddp_step_readings.py), in fresh ranks 3% above.
    `allreduce`: once every profiler is done, the gloo all-reduce fit."""

    path = Path(path)
    with tempfile.TemporaryDirectory() as d:
        spec_file = Path(d) / "spec.json"
        spec_file.write_text(json.dumps(spec.model_dump(mode="json", by_alias=True)))
        busy = Path(d) / "busy"
        busy.mkdir()
        peers = sum(1 for _, prof in jobs if prof)
        procs, parts = [], []
        for i, (g, prof) in enumerate(jobs):
            env = {**os.environ, "OMP_NUM_THREADS": str(group_threads(g, spec.cluster.world_size)), **g.env}
            root = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            part = path.with_name(f"{path.name}.{g.name}.part")
            if prof:
                if not part.exists():
                    (load_profile(path) if path.exists() else Profile.new()).save(part)
                parts.append((g, part))
            argv = [sys.executable, "-m", "qsync_opt.training.predictor.profiler", str(spec_file), g.name, str(part),
                    "--busy", str(busy), "--peers", str(peers)]
            if not prof:
                argv.append("--busy-only")
            if allreduce or ddp:
                argv += ["--rank", str(i), "--world", str(len(jobs))]
                argv += ["--allreduce"] if allreduce else []
                argv += ["--ddp"] if ddp else []
            if not progress or i:  # one progress bar on the terminal, not interleaved ones
                argv.append("--quiet")
            procs.append((g, prof, subprocess.Popen(argv, env=env)))
        bad = wait_all([(g.name, p) for g, _, p in procs])
        if bad:
            raise ProfileError(f"profiler: group(s) {', '.join(f'{n} (exit {rc})' for n, rc in bad)} failed; "
                               "see the messages above (measured entries are kept and resumed next time)")
        got = read_results(busy, len(jobs))
    merge_parts(path, [(part, key_of(g)) for g, part in parts])
    return got


def merge_parts(path: Path, parts: list[tuple[Path, str]]) -> None:
    """Copy each part's own section (only that one: its copies of the others are stale) into the
    profile at `path`, then delete the parts."""
    merged = load_profile(path) if path.exists() else Profile.new()
    for part, key in parts:
        merged.sections[key] = load_profile(part).sections[key]
    merged.save(path)
    for part, _ in parts:
        part.unlink(missing_ok=True)


def wait_all(procs: list[tuple[str, subprocess.Popen]], poll_s: float = 0.05) -> list[tuple[str, int]]:
    """Wait for every process; once one fails, stop the others (they would keep busy waiting
    for its 'done' mark) and return [(name, exit code)] of the failed ones. When this process is
    stopped while it waits (a `Stopped` or KeyboardInterrupt), the processes are ended first."""
    try:
        return _wait_all(procs, poll_s)
    except BaseException:
        for _, p in procs:
            if p.poll() is None:
                p.terminate()
        for _, p in procs:
            p.wait()
        raise


def _wait_all(procs: list[tuple[str, subprocess.Popen]], poll_s: float) -> list[tuple[str, int]]:
    while True:
        codes = [(n, p.poll()) for n, p in procs]
        bad = [(n, rc) for n, rc in codes if rc not in (None, 0)]
        if bad:
            for _, p in procs:
                if p.poll() is None:
                    p.terminate()
            for _, p in procs:
                p.wait()
            return bad
        if all(rc == 0 for _, rc in codes):
            return []
        time.sleep(poll_s)


def keep_busy(step, busy: Path, peers: int, *, done_name: str | None) -> None:
    """Mark this profiler done (if it is one), then run `step` until all `peers` are done."""
    if done_name is not None:
        (busy / f"{done_name}.done").touch()
    t0 = time.monotonic()
    while len(list(busy.glob("*.done"))) < peers and time.monotonic() - t0 < BUSY_LIMIT_S:
        step()
