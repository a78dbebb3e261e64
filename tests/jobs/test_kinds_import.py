"""A spec imports only its own kind: a scheduler that plans serving, rollout or loading jobs does not carry torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("example, plan", [("serving_opt30b_t4_v100.yaml", "ServingPlan"),
                                           ("rollout_cpu_tiny.yaml", "RolloutPlan"),
                                           ("loading_cpu_mix.yaml", "LoadingPlan")])
def test_planning_a_kind_other_than_training_does_not_import_torch(example, plan):
    code = ("import sys, qsync_opt\n"
            f"p = qsync_opt.solve({str(ROOT / 'examples' / example)!r})\n"
            "print(type(p).__name__, sorted(m for m in sys.modules if m == 'torch' or m.startswith('qsync_opt.training')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[0] == plan
    assert r.stdout.strip().endswith("[]"), r.stdout  # neither torch nor the training kind was imported


def test_the_registry_imports_a_kind_when_it_is_looked_up():
    code = ("import sys\nfrom qsync_opt import jobs\n"
            "assert list(jobs.KINDS) == ['training', 'serving', 'rollout', 'loading']\n"
            "assert 'qsync_opt.rollout.kind' not in sys.modules\n"
            "k = jobs.KINDS['rollout']\n"
            "assert k.name == 'rollout' and 'qsync_opt.rollout.kind' in sys.modules\n"
            "assert 'qsync_opt.training.kind' not in sys.modules\n"
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_a_job_model_finds_its_kind_and_an_unknown_kind_is_named():
    import qsync_opt
    from qsync_opt import jobs
    from qsync_opt.errors import SpecError

    for name in jobs.KINDS:
        job = jobs.load_spec(ROOT / jobs.KINDS[name].example)
        assert jobs.kind_of_job(job).name == name
    with pytest.raises(SpecError, match="kinds: training, serving, rollout, loading"):
        jobs.kind("nosuch")
    with pytest.raises(AttributeError, match="nosuch"):
        qsync_opt.nosuch  # noqa: B018
    assert {"solve", "Plan", "ServingPlan", "RolloutPlan", "JobSpec"} <= set(dir(qsync_opt))
