"""The engines: in process and on Ray give the same sample sequence and the same samples,
and one resumes from a state the other wrote."""

import pytest
import torch

from qsync_opt.data.config import DataSpec
from qsync_opt.loading.engine import open_engine

SOURCES = [
    {"name": "short", "builtin": "synthetic-lm", "kwargs": {"num_samples": 300, "median": 32, "max_len": 128}, "weight": 3},
    {"name": "long", "builtin": "synthetic-lm",
     "kwargs": {"num_samples": 80, "median": 400, "min_len": 100, "max_len": 900, "seed": 1},
     "schedule": [[0, 0.5], [4, 2.0]]},
]


def data(engine="inprocess", sources=SOURCES):
    return DataSpec(sources=sources, engine=engine, balance="attention")


def steps(engine, n):
    out = []
    for _ in range(n):
        plan = engine.next_batch()
        samples = engine.read(plan.samples)
        out.append((plan.samples, plan.owner, [s.tolist() for s in samples]))
    return out


def test_local_engine_reads_the_planned_samples():
    eng = open_engine(data(), global_batch=8, speeds=[1.0, 0.5])
    plan = eng.next_batch()
    got = eng.read(plan.samples)
    assert [int(t.numel()) for t in got] == plan.lengths
    assert all(isinstance(t, torch.Tensor) for t in got)


@pytest.mark.slow
def test_ray_matches_inprocess_and_resumes(ray_local):
    kw = dict(global_batch=8, speeds=[1.0, 0.5], backend=None)  # heuristic split: no solver import in the actor
    local = open_engine(data(), **kw)
    ref = steps(local, 6)
    remote = open_engine(data("ray"), **kw)
    try:
        assert steps(remote, 3) == ref[:3]
        state = remote.state_dict()
        fresh = open_engine(data(), **kw)
        fresh.load_state_dict(state)
        assert steps(fresh, 3) == ref[3:]
    finally:
        remote.close()
