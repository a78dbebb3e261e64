"""Specs and plans for the distributed runtime tests (a Plan as the planner would write it)."""

from __future__ import annotations

from pathlib import Path

import yaml

from qsync_opt.training.plan import GroupPlan, Plan, Provenance, SolverReport
from qsync_opt.training.spec import JobSpec, load_spec


def write_spec(path: Path, *, model="tiny-cnn", batches=(16, 16), env1=None, steps=20, optimizer="adam",
               lr=0.003, **runtime) -> JobSpec:
    """A two-group CPU job, one rank per group; the second group may get its own environment."""
    groups = [
        {"name": "fast", "device": "cpu-local", "count": 1, "local_batch": batches[0]},
        {"name": "slow", "device": "cpu-noamx", "count": 1, "local_batch": batches[1], "env": env1 or {}},
    ]
    data = {"name": "rt-test", "cluster": {"groups": groups, "interconnect": "loopback"}, "model": {"name": model},
            "training": {"global_batch": sum(batches), "optimizer": optimizer, "lr": lr, "steps": steps, "seed": 3}}
    if runtime:
        data["runtime"] = runtime
    path.write_text(yaml.safe_dump(data))
    return load_spec(path)


def make_plan(spec: JobSpec, precisions: dict[str, dict[str, str]]) -> Plan:
    lb = spec.local_batches()
    groups = {
        g.name: GroupPlan(device=g.device, count=g.count, local_batch=lb[g.name], precisions=precisions[g.name],
                          compute_ms=1.0, comm_exposed_ms=0.0, iteration_ms=1.0, peak_memory_bytes=1.0,
                          memory_capacity_bytes=1e9, indicator=0.0)
        for g in spec.cluster.groups
    }
    return Plan(job=spec.name, model=spec.model.name, objective="accuracy_degradation", groups=groups,
                iteration_ms=1.0, indicator=0.0,
                solver=SolverReport(backend="test", status="heuristic", objective=0.0, wall_s=0.0),
                provenance=Provenance(spec_digest=spec.digest(), versions={}))
