"""Checkpoint, stop and resume: a resumed run continues exactly where the uninterrupted one would be.

Exact (==) comparisons are justified: with 1 thread per rank, the same kernels, gloo's
deterministic 2-rank all-reduce, data addressed by sample index and every RNG restored
(dropout and stochastic rounding draw from it), the arithmetic is the same sequence.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from rt_jobs import make_plan, write_spec

from qsync_opt.errors import RuntimeSetupError
from qsync_opt.models.zoo import build_model
from qsync_opt.runtime import selectable_modules
from qsync_opt.runtime import checkpoint as ckpt
from qsync_opt.runtime.checkpoint import latest
from qsync_opt.training.runtime.launch import run_job
from qsync_opt.training.runtime.trainer import EXIT_STOPPED

pytestmark = pytest.mark.timeout(300)


def _bert_plan(spec):
    names = list(selectable_modules(build_model("tiny-bert")))
    fast = {n: ("bf16" if i % 2 else "int8") for i, n in enumerate(names)}
    slow = {n: ("int4" if "dense" in n else "int8") for n in names}
    return make_plan(spec, {"fast": fast, "slow": slow})


def _state(ckdir):
    return torch.load(latest(ckdir) / "state.pt", weights_only=True)


def test_resume_needs_a_checkpoint_dir(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", batches=(16, 16), steps=2)
    with pytest.raises(RuntimeSetupError, match="resume=True needs checkpoint_dir"):
        run_job(spec, None, resume=True)


def test_checkpoint_restores_rngs_and_refuses_another_setup(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    meta = {"world_size": 2, "local_batches": [6, 4]}
    ckpt.save_rank_files(tmp_path, 7, 0, model_state=model.state_dict(), optimizer_state=opt.state_dict(), meta=meta)
    ckpt.save_rank_files(tmp_path, 7, 1)
    assert ckpt.latest(tmp_path) is None, "not visible before publish"
    ckpt.publish(tmp_path, 7)
    draws = (torch.rand(3), random.random(), np.random.rand())
    state, rng = ckpt.load(tmp_path, 0, expect_meta=meta)
    ckpt.set_rng_state(rng)
    assert torch.equal(torch.rand(3), draws[0]) and random.random() == draws[1] and np.random.rand() == draws[2]
    assert state["step"] == 7 and torch.equal(state["model"]["weight"], model.weight)
    opt2 = torch.optim.Adam(model.parameters())
    opt2.load_state_dict(state["optimizer"])
    with pytest.raises(RuntimeSetupError, match=r"local_batches was \[6, 4\] when saved but is \[5, 5\] now"):
        ckpt.load(tmp_path, 0, expect_meta={**meta, "local_batches": [5, 5]})
    for step in (8, 9):
        ckpt.save_rank_files(tmp_path, step, 0, model_state={}, optimizer_state={}, meta=meta)
        ckpt.publish(tmp_path, step)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_00000008", "step_00000009"]
    assert ckpt.latest(tmp_path).name == "step_00000009"


def test_resume_after_a_hard_kill_reproduces_the_uninterrupted_run(tmp_path):
    """A run killed (kill -9) somewhere after its step-4 checkpoint resumes from it and ends
    bit-identical to the run that was never interrupted.

    tiny-bert has dropout and the plan rounds stochastically: both draw from the RNGs the
    checkpoint restores, so an exact match also shows that every RNG came back.
    """
    spec = write_spec(tmp_path / "spec.yaml", model="tiny-bert", batches=(6, 4), steps=8, rounding="stochastic")
    plan = _bert_plan(spec)
    straight = run_job(spec, plan, checkpoint_dir=str(tmp_path / "a"), checkpoint_every=4, threads=1, timeout_s=240)
    assert straight.ok and straight.steps_done == 8
    # what a kill during step 7 leaves behind: checkpoint 4 published, metrics up to step 6
    crashed = tmp_path / "b"
    (crashed / "metrics").mkdir(parents=True)
    shutil.copytree(tmp_path / "a" / "step_00000004", crashed / "step_00000004")
    (crashed / "latest").write_text("step_00000004\n")
    for r in (0, 1):
        lines = (tmp_path / "a" / "metrics" / f"rank{r}.jsonl").read_text().splitlines()
        kept = [x for x in lines if json.loads(x).get("step", 0) <= 6]
        (crashed / "metrics" / f"rank{r}.jsonl").write_text("\n".join(kept) + "\n")
    resumed = run_job(spec, plan, checkpoint_dir=str(crashed), resume=True, threads=1, timeout_s=240)
    assert resumed.ok and resumed.steps_done == 8
    assert resumed.losses == straight.losses, "resumed losses differ from the uninterrupted run"
    a, b = _state(tmp_path / "a"), _state(crashed)
    assert a["step"] == b["step"] == 8
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    build_model("tiny-bert").load_state_dict(b["model"])  # plain FQNs: loads into the unquantized model


@pytest.mark.slow
def test_sigterm_finishes_the_step_checkpoints_and_resumes_exactly(tmp_path):
    """Stop a run with SIGTERM, resume it, and compare with a run that was never stopped.

    tiny-bert has dropout and the plan rounds stochastically: both draw from the RNGs the
    checkpoint restores, so an exact match also shows that every RNG came back.
    """
    spec = write_spec(tmp_path / "spec.yaml", model="tiny-bert", batches=(6, 4), steps=100_000,
                      rounding="stochastic", env1={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"})
    plan = _bert_plan(spec)
    spec_path, plan_path, ck = tmp_path / "spec.yaml", plan.save(tmp_path / "plan.json"), tmp_path / "ck"
    code = ("import sys; from qsync_opt.training.runtime.launch import launch; "
            "sys.exit(launch(sys.argv[1], sys.argv[2], checkpoint_dir=sys.argv[3], checkpoint_every=1000, threads=1))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(spec_path), str(plan_path), str(ck)])
    metrics = ck / "metrics" / "rank0.jsonl"
    deadline = time.monotonic() + 150
    while not (metrics.exists() and metrics.read_text().count('"loss"') >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == EXIT_STOPPED, "SIGTERM must end the run cleanly, as stopped (not done)"

    stopped = {r: [json.loads(x) for x in (ck / "metrics" / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    k = next(x["step"] for x in stopped[0] if x.get("event") == "stopped")
    assert next(x["step"] for x in stopped[1] if x.get("event") == "stopped") == k, "ranks stop after the same step"
    assert 3 <= k < 100_000 and _state(ck)["step"] == k
    assert max(x["step"] for x in stopped[0] if "loss" in x) == k, "the step in flight was finished and logged"

    resumed = run_job(spec, plan, steps=k + 2, checkpoint_dir=str(ck), resume=True, threads=1, timeout_s=120)
    straight = run_job(spec, plan, steps=k + 2, checkpoint_dir=str(tmp_path / "straight"), threads=1, timeout_s=120)
    assert resumed.ok and straight.ok and resumed.steps_done == k + 2
    assert resumed.losses == straight.losses, "resumed losses differ from the uninterrupted run"
    a, b = _state(tmp_path / "straight"), _state(ck)
    assert a["step"] == b["step"] == k + 2
    assert all(torch.equal(a["model"][n], b["model"][n]) for n in a["model"])
    build_model("tiny-bert").load_state_dict(b["model"])  # plain FQNs: loads into the unquantized model
