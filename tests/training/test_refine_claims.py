"""A refined plan's note states what was measured: status and gap against the untightened program's bound."""

import pytest

from qsync_opt.training.pipeline import plan_training, prepare
from qsync_opt.training.spec import load_spec

SPEC = {  # on a slow link a lowered T4 hides less all-reduce
    "name": "refine",
    "cluster": {"groups": [{"name": "v100", "device": "V100-16GB", "count": 4, "role": "training"},
                           {"name": "t4", "device": "T4", "count": 4}], "interconnect": "ethernet-25g"},
    "model": {"name": "resnet18"},
    "training": {"global_batch": 256},
    "solver": {"backend": "highs", "time_limit_s": 20},
    "runtime": {"boundary": "edge"},
}


def test_refine_note_names_the_bound_the_gap_was_measured_against(monkeypatch):
    import qsync_opt.training.refine

    prepared = prepare(load_spec(SPEC))
    first = plan_training(load_spec(SPEC, **{"solver.refine_rounds": 0}), prepared)  # the original program alone
    # the program bounds the lockstep iteration exactly, so refining needs a replayer that disagrees with it
    monkeypatch.setattr(qsync_opt.training.refine, "meets_time_bound", lambda instance, lockstep_ms: False)
    refined = plan_training(load_spec(SPEC, **{"solver.refine_rounds": 5}), prepared)
    s = refined.solver
    assert s.refine_rounds >= 1 and first.solver.best_bound is not None
    assert s.best_bound == pytest.approx(first.solver.best_bound, rel=1e-9)  # the untightened program's bound ...
    assert s.gap == max(0.0, s.objective - s.best_bound) / abs(s.objective)  # ... is what the gap measures
    note = next(n for n in s.notes if n.startswith(f"status {s.status!r}"))
    assert "original, untightened" in note and "not of a tightened" in note
