"""The whole `solve` (batch_split: auto's candidates, the main solve, refine rounds, diagnosis) stays within
solver.time_limit_s. Load-independent: every backend call reports that it used half the seconds it was
granted (a slow solver), and the test adds up what was granted and used; no wall clock is read."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qsync_opt.training.pipeline import plan_training, prepare
from qsync_opt.solver.backends import BACKENDS
from qsync_opt.training.spec import load_spec

LIMIT = 20.0
SPEC = {
    "name": "budget",
    "cluster": {"groups": [{"name": "v100", "device": "V100-16GB", "count": 4, "role": "training"},
                           {"name": "t4", "device": "T4", "count": 4}], "interconnect": "ethernet-25g"},
    "model": {"name": "resnet18"},
    "training": {"global_batch": 256},
    "solver": {"backend": "highs", "time_limit_s": LIMIT, "refine_rounds": 5},
    "runtime": {"boundary": "edge"},
}
USED = 0.5
"""Share of its grant each (simulated) backend call uses."""


@pytest.fixture(scope="module")
def prepared():
    return prepare(load_spec(SPEC))


@pytest.fixture
def calls(monkeypatch):
    """[(seconds granted, seconds charged)] for every backend call, in order."""
    import qsync_opt.training.refine

    # the program bounds the lockstep iteration exactly; refine rounds need a replayer that disagrees with it
    monkeypatch.setattr(qsync_opt.training.refine, "meets_time_bound", lambda instance, lockstep_ms: False)
    log = []
    for mod in BACKENDS.values():
        real = mod.solve

        def slow(problem, options, real=real):
            raw = real(problem, options)
            used = USED * options.time_limit_s
            # the budget limits solve time; a backend's model building is reported beside it (solver/budget.py)
            log.append((options.time_limit_s, max(0.0, used - raw.build_s)))
            return replace(raw, wall_s=max(used, raw.build_s), build_s=raw.build_s)

        monkeypatch.setattr(mod, "solve", slow)
    return log


@pytest.mark.parametrize("split", ["fixed", "auto"])
def test_every_backend_call_is_granted_only_what_the_limit_has_left(prepared, calls, split):
    plan = plan_training(load_spec(SPEC, **{"training.batch_split": split}), prepared)
    assert len(calls) >= (3 if split == "auto" else 2)  # candidates and/or refine rounds really ran
    if split == "fixed":
        assert plan.solver.refine_rounds >= 1
    spent = 0.0
    for k, (given, used) in enumerate(calls):
        assert given <= LIMIT - spent + 1e-9, f"call {k} granted {given:.3f} s with {LIMIT - spent:.3f} s left: {calls}"
        spent += used
    assert spent <= LIMIT + 1e-9
    assert plan.solver.solve_s >= spent - 1e-9  # the simulated seconds were all charged to the plan's solve time
