"""`qsync-opt train` through the data plane (a spec with data.sources): the coordinator's
split follows the ranks' speeds from the plan, the logged loss and the gradient are those of
single-process training on each whole global batch, and a run resumed from a checkpoint whose
data-plane state is a delta continues the exact sample-id sequence and losses."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from qsync_opt.loading import collate
from qsync_opt.loading.sources import open_source
from qsync_opt.models.zoo import build_model
from qsync_opt.runtime import selectable_modules
from qsync_opt.training.plan import GroupPlan, Plan, Provenance, SolverReport
from qsync_opt.training.runtime.launch import run_job
from qsync_opt.training.spec import load_spec

pytestmark = pytest.mark.timeout(300)
MODEL_KW = {"vocab_size": 256, "max_positions": 128, "dropout": 0.0}


def _spec(path: Path):
    doc = {
        "name": "plane-train", "kind": "training",
        "cluster": {"groups": [{"name": "fast", "device": "cpu-local", "count": 1},
                               {"name": "slow", "device": "cpu-local", "count": 1}], "interconnect": "loopback"},
        "model": {"name": "tiny-gpt2", "kwargs": MODEL_KW},
        "training": {"global_batch": 8, "optimizer": "sgd", "lr": 0.5, "steps": 4, "seq_len": 32, "seed": 1},
        "data": {"sources": [
            {"name": "short", "builtin": "pysource-lm", "weight": 3,
             "kwargs": {"median": 12, "min_len": 4, "max_len": 24, "train_bytes": 20000}},
            {"name": "long", "builtin": "pysource-lm", "weight": 1,
             "kwargs": {"median": 60, "min_len": 24, "max_len": 120, "train_bytes": 20000, "skip_bytes": 20000}}],
            "checkpoint_full_every": 3},
    }
    path.write_text(yaml.safe_dump(doc))
    return load_spec(path)


def _plan(spec, compute_ms):
    names = list(selectable_modules(build_model("tiny-gpt2", **MODEL_KW)))
    groups = {g.name: GroupPlan(device=g.device, count=1, local_batch=4, precisions={n: "fp32" for n in names},
                                compute_ms=compute_ms[g.name], comm_exposed_ms=0.0, iteration_ms=compute_ms[g.name],
                                peak_memory_bytes=1.0, memory_capacity_bytes=1e9, indicator=0.0)
              for g in spec.cluster.groups}
    return Plan(job=spec.name, model="tiny-gpt2", objective="accuracy_degradation", groups=groups,
                iteration_ms=max(compute_ms.values()), indicator=0.0,
                solver=SolverReport(backend="test", status="heuristic", objective=0.0, wall_s=0.0),
                provenance=Provenance(spec_digest=spec.digest(), versions={}))


def _steps(metrics: Path) -> list[dict]:
    return [json.loads(x) for x in (metrics / "data_plane.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_train_through_the_plane_is_single_process_training_and_resumes_exactly(tmp_path):
    spec = _spec(tmp_path / "spec.yaml")
    plan = _plan(spec, {"fast": 10.0, "slow": 30.0})  # the slow group's plan predicts 3x the time
    straight = run_job(spec, plan, checkpoint_dir=str(tmp_path / "a"), checkpoint_every=1, threads=1, timeout_s=240)
    assert straight.ok and straight.steps_done == 4
    log = _steps(tmp_path / "a" / "metrics")
    assert [s["step"] for s in log] == list(range(4))

    # (b) speeds from the plan (1 : 1/3): the slow rank is given far fewer tokens, and the
    # predicted per-rank times are balanced (each within one long sample's cost of the other)
    for s in log:
        assert s["method"] != "stride" and abs(s["predicted"][0] - s["predicted"][1]) <= 0.5 * max(s["predicted"])
    rank1_tokens = sum(json.loads(x).get("tokens", 0) for x in
                       (tmp_path / "a" / "metrics" / "rank1.jsonl").read_text().splitlines())
    rank0_tokens = sum(json.loads(x).get("tokens", 0) for x in
                       (tmp_path / "a" / "metrics" / "rank0.jsonl").read_text().splitlines())
    assert rank1_tokens < 0.6 * rank0_tokens

    # the logged loss and the update are those of one process on each whole global batch
    sources = [open_source(s, i) for i, s in enumerate(spec.data.sources)]
    torch.manual_seed(spec.training.seed)
    from qsync_opt.models.from_spec import build_from_spec

    ref = build_from_spec(spec)
    opt = torch.optim.SGD(ref.parameters(), lr=spec.training.lr)  # SGD: a wrong gradient scale shows
    ref_losses = []
    for s in log:
        opt.zero_grad()
        samples = [sources[a].get(b) for a, b in s["samples"]]
        targets = collate.target_count([len(x) for x in samples])
        total = sum(collate.lm_loss_sum(ref(x[None]).float(), x[None], torch.ones(1, len(x), dtype=torch.bool))
                    for x in samples)
        (total / targets).backward()
        opt.step()
        ref_losses.append(total.item() / targets)
    assert straight.losses == pytest.approx(ref_losses, rel=1e-4)

    # (a) + resume: what a kill during step 4 leaves: checkpoint 3 (a delta on the full state of step 1)
    state3 = torch.load(tmp_path / "a" / "step_00000003" / "state.pt", weights_only=True)
    assert state3["data_plane"]["kind"] == "delta" and state3["data_plane"]["base_step"] == 1
    crashed = tmp_path / "b"
    (crashed / "metrics").mkdir(parents=True)
    shutil.copytree(tmp_path / "a" / "step_00000003", crashed / "step_00000003")
    shutil.copytree(tmp_path / "a" / "data_plane", crashed / "data_plane")
    (crashed / "latest").write_text("step_00000003\n")
    for name in ("rank0.jsonl", "rank1.jsonl", "data_plane.jsonl"):
        lines = (tmp_path / "a" / "metrics" / name).read_text().splitlines()
        kept = [x for x in lines if json.loads(x).get("step", 0) < (3 if name == "data_plane.jsonl" else 4)]
        (crashed / "metrics" / name).write_text("\n".join(kept) + "\n")
    resumed = run_job(spec, plan, checkpoint_dir=str(crashed), resume=True, threads=1, timeout_s=240)
    assert resumed.ok and resumed.steps_done == 4
    assert _steps(crashed / "metrics") == log
    assert resumed.losses == straight.losses


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
