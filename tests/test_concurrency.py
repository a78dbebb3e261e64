"""qsync_opt.solve as a scheduler calls it: from many threads at once, whatever ran before.

A plan is a fact about its spec: the same status, objective and precision maps whether it is
solved alone, beside seven other solves, after the caller drew from torch's global RNG, or in
a fresh process (issue 24).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import qsync_opt

ROOT = Path(__file__).resolve().parents[1]
CPU_TINY = str(ROOT / "examples" / "cpu_tiny.yaml")
TINY_BERT = {
    "name": "tiny-bert-v100-t4",
    "cluster": {
        "groups": [
            {"name": "v100", "device": "V100-16GB", "count": 2, "role": "training", "local_batch": 20},
            {"name": "t4", "device": "T4", "count": 2, "local_batch": 12},
        ],
        "interconnect": "ethernet-100g",
    },
    "model": {"name": "tiny-bert"},
    "training": {"global_batch": 64},
    # a budget relative to the uniform-lowest plan: which ops fit it depends on the weights' indicator
    "objective": {"minimize": "iteration_time", "max_accuracy_degradation": "20%"},
    "solver": {"backend": "highs", "time_limit_s": 30},
    "runtime": {"boundary": "edge"},
}


def plan_key(plan) -> tuple:
    """What a user relies on: status, objective and every group's precision map."""
    return (plan.solver.status, plan.solver.objective,
            {g: dict(sorted(gp.precisions.items())) for g, gp in sorted(plan.groups.items())})


@pytest.mark.slow
def test_eight_threads_over_two_examples_and_two_backends_match_serial():
    jobs = [(spec, backend) for spec in (CPU_TINY, TINY_BERT) for backend in ("highs", "scip")] * 2
    serial = {i: plan_key(qsync_opt.solve(s, backend=b)) for i, (s, b) in enumerate(jobs[:4])}
    start = threading.Barrier(len(jobs))
    results: dict[int, object] = {}

    def run(i, spec, backend):
        start.wait()  # all eight build, trace and solve at the same time
        try:
            results[i] = plan_key(qsync_opt.solve(spec, backend=backend))
        except Exception as e:  # noqa: BLE001 - counted, and shown, below
            results[i] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=run, args=(i, s, b)) for i, (s, b) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    errors = [r for r in results.values() if isinstance(r, str)]
    assert not errors, errors
    differing = [i for i, r in results.items() if r != serial[i % 4]]
    assert len(results) == len(jobs) and not differing, [(jobs[i][1], results[i][:2], serial[i % 4][:2]) for i in differing]
    assert torch.nn.Module.__call__ is torch.nn.Module.__dict__["__call__"]
    assert qsync_opt.solve(CPU_TINY, backend="highs").solver.status == serial[0][0]  # a later serial solve still plans


def test_plan_does_not_depend_on_the_global_rng_or_the_process():
    reference = plan_key(qsync_opt.solve(TINY_BERT))
    torch.manual_seed(123)
    assert plan_key(qsync_opt.solve(TINY_BERT)) == reference
    torch.rand(10**6)
    state = torch.random.get_rng_state()
    assert plan_key(qsync_opt.solve(TINY_BERT)) == reference
    assert torch.equal(torch.random.get_rng_state(), state)  # solve neither reseeds nor draws from it
    code = ("import json, sys, qsync_opt\n"
            "p = qsync_opt.solve(json.loads(sys.argv[1]))\n"
            "print(json.dumps([p.solver.status, p.solver.objective, "
            "{g: dict(sorted(x.precisions.items())) for g, x in sorted(p.groups.items())}]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(TINY_BERT)], capture_output=True, text=True,
                         env=env, timeout=300, check=True).stdout
    status, objective, precisions = json.loads(out.strip().splitlines()[-1])
    assert (status, objective, precisions) == reference  # JSON keeps a float's shortest repr exactly
