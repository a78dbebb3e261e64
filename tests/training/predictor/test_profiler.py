"""The profiler covers every op of the graph, names ops as the tracer does, and resumes.

Timings themselves are never asserted (machine load); only which entries exist and which
get measured.
"""

from __future__ import annotations

import pytest

from qsync_opt.models.from_spec import build_from_spec, input_maker
from qsync_opt.models.tracing import trace
from qsync_opt.training.predictor import measuring, profiler
from qsync_opt.training.predictor.profile import load_profile, op_signature, step_key
from qsync_opt.training.spec import load_spec

SPEC = """
cluster:
  groups: [{name: here, device: cpu-local, precisions: [fp32, int8], env: {OMP_NUM_THREADS: "1"}}]
model: {name: tiny-cnn}
training: {global_batch: 2, optimizer: sgd}
"""


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(measuring, "BLOCKS", 1)
    monkeypatch.setattr(measuring, "REPEATS", 1)
    calls = []
    real = profiler.time_op
    monkeypatch.setattr(profiler, "time_op", lambda *a: calls.append(1) or real(*a))
    return calls


def raced_extra(sec) -> int:
    """time_op calls beyond one per signature: the losers measured_dispatch.race timed in full."""
    return sum(sum("fwd_ms" in c for c in e["candidates"].values()) - 1 for e in sec.dispatch.values())


def _graph(spec):
    import torch

    torch.manual_seed(spec.training.seed)
    m = build_from_spec(spec)
    return trace(m, input_maker(spec)(1, torch.Generator().manual_seed(0)), model_name=spec.model.name)


def test_every_op_at_every_precision_and_resume(tmp_path, fast):
    spec = load_spec(SPEC)
    path = tmp_path / "p.json"
    sec = profiler.profile_group(spec, "here", path, progress=False)
    gg = _graph(spec).for_batch(2)
    want = {op_signature(n, p) for n in gg.nodes for p in (("fp32", "int8") if n.selectable else ("fp32",))}
    assert want <= set(sec.ops)
    assert step_key("sgd", gg) in sec.optimizer
    assert {"fp32->bf16", "fp32->int8", "int8->fp32"} <= set(sec.casts)
    first = len(fast)
    assert first == len(want) + raced_extra(sec)
    # an interrupted run: drop two entries, run again -> only those two are measured
    prof = load_profile(path)
    s = prof.find_section({"OMP_NUM_THREADS": "1"}, 1)
    dropped = sorted(want)[:2]
    for sig in dropped:
        del s.ops[sig]
    prof.save(path)
    profiler.profile_group(spec, "here", path, progress=False)
    assert len(fast) == first + 2
    assert set(dropped) <= set(load_profile(path).find_section({"OMP_NUM_THREADS": "1"}, 1).ops)


def test_unknown_group_is_named(tmp_path):
    from qsync_opt.errors import SpecError

    with pytest.raises(SpecError, match="'nope'"):
        profiler.profile_group(load_spec(SPEC), "nope", tmp_path / "p.json", progress=False)


TWELVE = """
cluster:
  groups: [{name: here, device: cpu-local, precisions: [fp32, int8], env: {OMP_NUM_THREADS: "1"}}]
model: {name: tiny-gpt2, kwargs: {layers: 12}}
training: {global_batch: 2, optimizer: sgd, seq_len: 16}
"""


def test_a_twelve_block_model_measures_each_distinct_op_once(tmp_path, monkeypatch):
    """Twelve identical blocks: every (op kind, shapes, precision) is timed once, by one of the
    ops that have it, and every op of every block finds its entry."""
    monkeypatch.setattr(measuring, "BLOCKS", 1)
    monkeypatch.setattr(measuring, "REPEATS", 1)
    spec = load_spec(TWELVE)
    gg = _graph(spec).for_batch(2)
    want = [op_signature(n, p) for n in gg.nodes for p in (("fp32", "int8") if n.selectable else ("fp32",))]
    assert sum(n.kind == "linear" for n in gg.selectable) >= 12 * 4  # the blocks are there
    timed = []
    real = profiler.time_op
    monkeypatch.setattr(profiler, "time_op", lambda *a: timed.append(1) or real(*a))
    sec = profiler.profile_group(spec, "here", tmp_path / "p.json", graph=_graph(spec), progress=False)
    assert set(want) <= set(sec.ops)  # every op of every block has its entry, from an empty profile ...
    assert len(timed) == len(set(want)) + raced_extra(sec)  # ... so each distinct signature was timed once (its
    # class's first also by the implementations it was raced against: measured_dispatch.py) ...
    assert len(want) > 6 * len(set(want))  # ... where one per op would have timed six times as many
