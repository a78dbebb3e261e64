"""Specs, plans and user code files for the data tests (written into a temporary folder)."""

from __future__ import annotations

from pathlib import Path

import yaml

from qsync_opt.training.plan import GroupPlan, Plan, Provenance, SolverReport
from qsync_opt.training.spec import load_spec

USER_CODE = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset


def mlp(width=32):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))


def digits():
    from sklearn.datasets import load_digits
    b = load_digits()
    x = torch.tensor(b.data, dtype=torch.float32) / 16
    y = torch.tensor(b.target)
    return TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:], y[1400:])


def broken():
    raise RuntimeError("no such shard")


def wrong_kind():
    return [1, 2, 3]
'''


def write_job(folder: Path, *, data: dict, model: dict | None = None, steps=3, batches=(24, 8), name="s.yaml") -> Path:
    """A two-rank CPU job whose model and data may come from `userdata.py` beside the spec."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "userdata.py").write_text(USER_CODE)
    groups = [{"name": "fast", "device": "cpu-local", "local_batch": batches[0]},
              {"name": "slow", "device": "cpu-noamx", "local_batch": batches[1]}]
    spec = {"cluster": {"groups": groups, "interconnect": "loopback"},
            "model": model or {"import": "userdata:mlp", "input_shape": [64]},
            "training": {"global_batch": sum(batches), "optimizer": "adam", "lr": 0.01, "steps": steps, "seed": 2},
            "data": data}
    path = folder / name
    path.write_text(yaml.safe_dump(spec))
    return path


def fp32_plan(spec_path: Path, precisions: dict[str, dict[str, str]] | None = None) -> Path:
    spec = load_spec(spec_path)
    lb = spec.local_batches()
    groups = {g.name: GroupPlan(device=g.device, count=g.count, local_batch=lb[g.name],
                                precisions=(precisions or {}).get(g.name, {}), compute_ms=1.0, comm_exposed_ms=0.0,
                                iteration_ms=1.0, peak_memory_bytes=1.0, memory_capacity_bytes=1e9, indicator=0.0)
              for g in spec.cluster.groups}
    plan = Plan(job=spec.name, model=spec.model.name or spec.model.import_, objective="accuracy_degradation",
                groups=groups, iteration_ms=1.0, indicator=0.0,
                solver=SolverReport(backend="test", status="heuristic", objective=0.0, wall_s=0.0),
                provenance=Provenance(spec_digest=spec.digest(), versions={}))
    return plan.save(spec_path.parent / "plan.json")
