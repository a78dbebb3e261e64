"""Synchronous data parallelism over torch.distributed (gloo, 2 ranks, 1 thread each).

What a user depends on: a mixed-precision plan trains; the all-reduced gradient is the
global-batch gradient even when groups take different local batches; bad setups fail before
any process starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from qsync_opt.errors import RuntimeSetupError
from qsync_opt.runtime.data import SyntheticTask
from qsync_opt.training.runtime.launch import free_port, rank_envs, run_job, spawn_ranks, validate
from qsync_opt.training.runtime.trainer import build_rank_model, loss_weight
from tests.runtime.rt_jobs import make_plan, write_spec

pytestmark = pytest.mark.timeout(240)

MIXED = {"fast": {"conv1": "bf16", "conv2": "int8", "conv3": "fp32", "fc": "fp8_e4m3"},
         "slow": {"conv1": "int8", "conv2": "int4", "conv3": "bf16", "fc": "int8"}}


def test_mixed_plan_trains_20_steps_on_two_ranks_with_their_own_environments(tmp_path):
    env1 = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "OMP_NUM_THREADS": "2"}
    spec = write_spec(tmp_path / "spec.yaml", batches=(20, 12), env1=env1, lr=0.01)
    result = run_job(spec, make_plan(spec, MIXED), threads=1, metrics_dir=str(tmp_path / "m"), timeout_s=180)
    assert result.ok, result.returncodes
    assert result.steps_done == 20 and len(result.losses) == 20
    first, last5 = result.losses[0], sum(result.losses[-5:]) / 5
    # ten balanced classes start at ln 10 = 2.30; 20 steps of 32 samples take off about a tenth
    # (the old teacher's one-class labels made this 0.7x: learning the majority class)
    assert last5 < first - 0.08, f"loss did not decrease: {result.losses}"
    # both ranks log the same global-batch loss; each ran its own group's plan, batch and environment
    assert [r["loss"] for r in result.per_rank[1]] == result.losses
    starts = {r: next(x for x in _events(result, r) if x["event"] == "start") for r in (0, 1)}
    assert starts[0]["group"] == "fast" and starts[0]["local_batch"] == 20 and starts[0]["threads"] == 1
    assert starts[1]["precisions"] == {"int8": 2, "int4": 1, "bf16": 1}
    assert starts[1]["env"] == env1 and starts[1]["threads"] == 2, "the group's env reaches its rank"
    assert all(ms > 0 for ms in result.step_ms.values()) and result.samples_per_s > 0


def _events(result, rank):
    import json

    lines = (Path(result.metrics_dir) / f"rank{rank}.jsonl").read_text().splitlines()
    return [x for x in map(json.loads, lines) if "event" in x]


def test_ddp_gradient_is_the_global_batch_gradient(tmp_path):
    """Equal and unequal local batches: the weighted all-reduce equals one process on the whole batch."""
    specs = [write_spec(tmp_path / "equal.yaml", batches=(16, 16)),
             write_spec(tmp_path / "unequal.yaml", batches=(22, 10))]
    worker = Path(__file__).with_name("ddp_grad_worker.py")
    argv = [sys.executable, str(worker), str(tmp_path), str(tmp_path / "equal.yaml"), str(tmp_path / "unequal.yaml")]
    codes = spawn_ranks(argv, rank_envs(specs[0], threads=1, port=free_port()), timeout_s=180).codes
    assert codes == [0, 0]
    torch.set_num_threads(1)
    for i, spec in enumerate(specs):
        model = build_rank_model(spec, None, "fast")  # same seed as every rank
        task = SyntheticTask(spec)
        inputs, targets = task.samples(0, spec.training.global_batch)
        task.loss(model(*inputs), targets).backward()
        want = {n: p.grad for n, p in model.named_parameters()}
        for name in ("weighted", "unweighted"):
            got = [torch.load(tmp_path / f"spec{i}_{name}_rank{r}.pt") for r in (0, 1)]
            assert all(torch.equal(got[0][n], got[1][n]) for n in want), "ranks disagree after all-reduce"
            rel = max(((got[0][n] - want[n]).abs().max() / want[n].abs().max()).item() for n in want)
            if name == "weighted":
                assert rel < 1e-5, f"spec {i}: DDP gradient differs from the global-batch gradient by {rel:.2e}"
            elif i == 1:  # negative control: without the weights, unequal batches give a biased gradient
                assert rel > 1e-3


def test_loss_weight_makes_the_rank_average_a_global_mean():
    batches, world = [22, 10, 5, 3], 4
    weights = [loss_weight(b, world, sum(batches)) for b in batches]
    # DDP averages over ranks: (1/world) Σ w_r · mean_r == Σ (b_r/B) · mean_r
    assert sum(w / world for w in weights) == pytest.approx(1.0)
    assert [w / world for w in weights] == pytest.approx([b / sum(batches) for b in batches])


def test_setup_errors_are_raised_before_spawning(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", batches=(16, 16))
    plan = make_plan(spec, MIXED)
    with pytest.raises(RuntimeSetupError, match=r"nproc=3 but the spec's cluster has 2 device\(s\) \(fastx1, slowx1\)"):
        validate(spec, plan, nproc=3)
    other = write_spec(tmp_path / "other.yaml", batches=(16, 16))
    bad_groups = make_plan(other, MIXED).model_copy(update={"groups": {"fast": plan.groups["fast"],
                                                                         "t4": plan.groups["slow"]}})
    with pytest.raises(RuntimeSetupError, match=r"the plan: solved for groups \['fast', 't4'\] .* but this spec's cluster.groups are"):
        validate(spec, bad_groups)
    bad_batch = plan.model_copy(update={"groups": {**plan.groups, "slow": plan.groups["slow"].model_copy(
        update={"local_batch": 8})}})
    with pytest.raises(RuntimeSetupError, match=r"local batches \[16, 8\] sum to 24 but training.global_batch=32"):
        validate(spec, bad_batch)
    bad_fqn = make_plan(spec, {"fast": {"conv9": "int8"}, "slow": {}})
    with pytest.raises(RuntimeSetupError, match=r"conv9: no such module in TinyCNN; near matches: conv3, conv2, conv1"):
        run_job(spec, bad_fqn, metrics_dir=str(tmp_path / "m"))
    assert not (tmp_path / "m").exists(), "nothing was started"
