"""Helpers of the fault-injection suite: a tiny two-rank job, the CLI as a process, rank pids."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from qsync_opt.training.plan import GroupPlan, Plan, Provenance, SolverReport

ROOT = Path(__file__).resolve().parents[2]


def tiny_job(tmp: Path, **runtime_env) -> tuple[Path, Path]:
    """A two-rank CPU job (tiny-cnn, fp32 and int8 groups) and a plan for it; returns (spec, plan) paths."""
    groups = [{"name": "fast", "device": "cpu-local", "count": 1, "local_batch": 8},
              {"name": "slow", "device": "cpu-noamx", "count": 1, "local_batch": 8, "env": runtime_env}]
    data = {"name": "faults", "cluster": {"groups": groups, "interconnect": "loopback"}, "model": {"name": "tiny-cnn"},
            "training": {"global_batch": 16, "optimizer": "adam", "steps": 10_000, "seed": 1},
            "runtime": {"kernels": "torch"}}
    spec_path = tmp / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    from qsync_opt.models.zoo import build_model
    from qsync_opt.runtime import selectable_modules

    names = list(selectable_modules(build_model("tiny-cnn")))
    groups = {g["name"]: GroupPlan(device=g["device"], count=1, local_batch=8,
                                   precisions={n: ("int8" if g["name"] == "slow" else "fp32") for n in names},
                                   compute_ms=1.0, comm_exposed_ms=0.0, iteration_ms=1.0, peak_memory_bytes=1.0,
                                   memory_capacity_bytes=1e9, indicator=0.0) for g in groups}
    plan = Plan(job="faults", model="tiny-cnn", objective="accuracy_degradation", groups=groups, iteration_ms=1.0,
                indicator=0.0, solver=SolverReport(backend="test", status="heuristic", objective=0.0, wall_s=0.0),
                provenance=Provenance(spec_digest="test", versions={}))
    return spec_path, plan.save(tmp / "plan.json")


def cli(*args, **kw) -> subprocess.Popen:
    """`qsync-opt ARGS` as its own process (stdout/stderr captured), with one thread per rank."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "qsync_opt.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw)


def children(pid: int) -> dict[int, int]:
    """rank -> pid of the launcher `pid`'s rank processes (read from /proc: no psutil needed)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) != pid:
                continue
            env = dict(x.split("=", 1) for x in (d / "environ").read_bytes().decode(errors="replace").split("\0") if "=" in x)
        except (OSError, IndexError, ValueError):
            continue
        if "RANK" in env:
            out[int(env["RANK"])] = int(d.name)
    return out


def wait_for(cond, proc: subprocess.Popen, timeout: float = 240.0, what: str = "condition"):
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if proc.poll() is not None:
            raise AssertionError(f"launcher exited ({proc.returncode}) before {what}: {proc.stderr.read()[-3000:]}")
        if time.monotonic() > end:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def loss_lines(metrics: Path, rank: int = 0) -> list[dict]:
    f = metrics / f"rank{rank}.jsonl"
    if not f.exists():
        return []
    out = []
    for line in f.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "loss" in rec:
            out.append(rec)
    return out


HANG_S = 60.0
"""Seconds after which a rank left running counts as hung (the launcher's SIGKILL follows its SIGTERM by 3 s)."""


def gone(pid: int) -> bool:
    """Whether process `pid` has exited (a zombie only waits for its parent to read its code)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def kill(pid: int, sig=signal.SIGKILL) -> float:
    os.kill(pid, sig)
    return time.monotonic()
