"""Profile files round-trip; corrupt, truncated, foreign and stale ones are refused by name;
measured costs replace the roofline exactly where a profile covers the group."""

from __future__ import annotations

import json

import pytest

from predictor_graphs import flat_omega, mlp_graph
from qsync_opt.training.predictor.instance_builder import build_instance
from qsync_opt.training.predictor.profile import (Profile, ProfileError, load_profile, machine_description, op_signature,
                                         step_key)
from qsync_opt.training.predictor.measuring import fit_line as _fit_line, robust_ms
from qsync_opt.training.predictor.step_profile import steps_key
from qsync_opt.training.spec import load_spec


def _skey(graph, global_batch: int = 32, offset: int = 0) -> str:
    """step_profile.steps_key of a group whose first rank reads synthetic samples from `offset`."""
    return step_key("adam", graph) + f"|data=synthetic@{offset}/{global_batch}"


def _profile(graph, precisions=("fp32", "bf16", "int8"), env=None, threads=1, ranks=1, global_batch=32,
             offset=0) -> Profile:
    prof = Profile.new()
    sec = prof.section(env or {}, threads, ranks)
    for i, n in enumerate(graph.nodes):
        for p in precisions if n.selectable else ("fp32",):
            sec.ops[op_signature(n, p)] = {"fwd_ms": 1.0 + i + 0.125 * precisions.index(p), "bwd_ms": 2.0 + i}
    sec.casts["fp32->bf16"] = {"a_ms_per_elem": 1e-6, "b_ms": 0.01}
    sec.optimizer[step_key("adam", graph)] = 0.5
    # whole steps equal to the op sums (dyadic figures: exact sums): no gap, the op figures stand
    for p in precisions:
        sec.steps.setdefault(_skey(graph, global_batch, offset), {})[p] = 0.5 + sum(
            e["fwd_ms"] + e["bwd_ms"] for n in graph.nodes
            for e in [sec.ops[op_signature(n, p if n.selectable else "fp32")]])
    prof.allreduce["gloo/2"] = {"alpha_ms": 0.2, "beta_ms_per_byte": 1e-6}
    return prof


def test_round_trip(tmp_path):
    prof = _profile(mlp_graph())
    path = tmp_path / "p.json"
    prof.save(path)
    back = load_profile(path)
    assert back.machine == machine_description()
    assert back.to_dict()["sections"] == prof.to_dict()["sections"]
    assert back.allreduce == prof.allreduce
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, nothing left behind


@pytest.mark.parametrize("damage, match", [
    (lambda text: text[: len(text) // 2], "not readable JSON"),
    (lambda text: "{\x00garbage", "not readable JSON"),
    (lambda text: json.dumps({"format": "something-else"}), "not a qsync-opt profile"),
    (lambda text: json.dumps({**json.loads(text), "version": 99}), "version 99"),
    (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "sections"}), "'sections'"),
    (lambda text: text.replace('"bwd_ms": 2.0', '"bwd_ms": "fast"', 1), "not non-negative numbers"),
], ids=["truncated", "garbage", "foreign-format", "version", "missing-field", "bad-number"])
def test_damaged_profiles_are_refused_by_name(tmp_path, damage, match):
    path = tmp_path / "p.json"
    _profile(mlp_graph()).save(path)
    path.write_text(damage(path.read_text()))
    with pytest.raises(ProfileError, match=match) as e:
        load_profile(path)
    assert str(path) in str(e.value)


def test_foreign_machine_is_refused(tmp_path):
    prof = _profile(mlp_graph())
    prof.machine = {**prof.machine, "cpu": "Some Other CPU 9000", "isa": ["avx2"]}
    path = tmp_path / "other.json"
    prof.save(path)
    with pytest.raises(ProfileError, match="another machine") as e:
        load_profile(path)
    assert str(path) in str(e.value)


ENV = {"OMP_NUM_THREADS": "1"}
SPEC = """
cluster:
  groups:
    - {name: here, device: cpu-local, profile: %s, env: {OMP_NUM_THREADS: "1"}}
    - {name: t4, device: T4}
model: {name: tiny-cnn}
training: {global_batch: 32, optimizer: adam}
objective: {max_iteration_time: 1000.0}
"""


def test_measured_costs_replace_the_roofline_for_the_profiled_group(tmp_path):
    graph = mlp_graph(batch=1)
    path = tmp_path / "p.json"
    spec = load_spec(SPEC % path)
    prof = _profile(graph.for_batch(16), env=ENV)
    prof.save(path)
    inst, ctx = build_instance(spec, graph, flat_omega(graph))
    here, t4 = ctx.group("here"), ctx.group("t4")
    assert here.cost_source == f"measured ({path})" and here.boundary == "fp32"
    assert t4.cost_source.startswith("roofline")
    sec = prof.find_section(ENV, 1)
    for n in here.graph.selectable:
        for p, c in here.costs[n.name].items():
            e = sec.ops[op_signature(n, p)]
            assert (c.fwd_ms, c.bwd_ms, c.weight_cast_ms) == (e["fwd_ms"], e["bwd_ms"], 0.0)
    assert here.optimizer_ms == 0.5
    assert any("costs of here: measured" in n for n in ctx.notes)


def test_a_profile_missing_the_model_falls_back_with_the_reason(tmp_path):
    graph = mlp_graph(batch=1)
    path = tmp_path / "p.json"
    _profile(graph.for_batch(8), env=ENV).save(path)  # another batch: other shapes
    _, ctx = build_instance(load_spec(SPEC % path), graph, flat_omega(graph))
    assert ctx.group("here").cost_source.startswith("roofline") and "lacks" in ctx.group("here").cost_source
    with pytest.raises(ProfileError, match="costs: measured"):
        build_instance(load_spec((SPEC % path) + "costs: measured\n"), graph, flat_omega(graph))


def test_robust_estimator_and_line_fit():
    calls = []
    ms = robust_ms(lambda: calls.append(1), warmup=2, blocks=3, repeats=4)
    assert len(calls) == 2 + 3 * 4 and ms >= 0
    a, b = _fit_line([1, 2, 3, 4], [3.0, 5.0, 7.0, 9.0])
    assert (a, b) == pytest.approx((2.0, 1.0))


def test_a_remote_device_needs_a_profile_of_that_device(tmp_path):
    from qsync_opt.hardware.device import find_device

    graph = mlp_graph(batch=1)
    prof = _profile(graph.for_batch(16), precisions=find_device("T4").precisions, global_batch=16)
    path = tmp_path / "t4.json"
    prof.save(path)  # measured here (a CPU), given to a T4 group
    spec = load_spec(f"""
cluster:
  groups: [{{name: t4, device: T4, profile: {path}}}]
model: {{name: tiny-cnn}}
training: {{global_batch: 16, optimizer: adam}}
objective: {{max_iteration_time: 1000.0}}
""")
    with pytest.raises(ProfileError, match="not on a T4") as e:
        build_instance(spec, graph, flat_omega(graph))
    assert str(path) in str(e.value)
    prof.machine = {"kind": "cuda", "gpu": "Tesla T4", "capability": "7.5", "cpu": "x", "isa": []}
    prof.save(path)
    _, ctx = build_instance(spec, graph, flat_omega(graph))
    assert ctx.group("t4").cost_source == f"measured ({path})"


def test_whole_step_gaps_are_carried_from_profile_to_costs(tmp_path):
    """A step measured longer (or shorter) than its op sum: each precision's gap is shared by the
    selectable ops in proportion to their time, inside the step (before the gradients a
    lockstep waits for), not on the optimizer; uniform plans then replay to exactly the
    measured steps."""
    from qsync_opt.training.predictor.replayer import replay

    graph = mlp_graph(batch=1)
    gg = graph.for_batch(16)
    path = tmp_path / "p.json"
    prof = _profile(gg, env=ENV)
    sec = prof.find_section(ENV, 1)
    key = _skey(gg)
    assert steps_key(load_spec(SPEC % path), gg, "here") == key
    exact = dict(sec.steps[key])
    sec.steps[key] = {"fp32": exact["fp32"] + 3.0, "bf16": exact["bf16"] + 3.0 + 2.0, "int8": exact["int8"] + 1.0}
    prof.save(path)
    _, ctx = build_instance(load_spec(SPEC % path), graph, flat_omega(graph))
    here = ctx.group("here")
    sel = here.graph.selectable
    assert here.optimizer_ms == pytest.approx(0.5)
    total = {p: sum(sec.ops[op_signature(n, p)]["fwd_ms"] + sec.ops[op_signature(n, p)]["bwd_ms"] for n in sel)
             for p in ("fp32", "bf16", "int8")}
    for n in sel:
        e = {p: sec.ops[op_signature(n, p)] for p in ("fp32", "bf16", "int8")}
        c = here.costs[n.name]
        for p, extra in (("fp32", 3.0), ("bf16", 5.0), ("int8", 1.0)):
            f = 1 + extra / total[p]
            assert (c[p].fwd_ms, c[p].bwd_ms) == pytest.approx((e[p]["fwd_ms"] * f, e[p]["bwd_ms"] * f))
    t4_plan = {n.name: "fp32" for n in ctx.group("t4").graph.selectable}
    for p in ("fp32", "bf16", "int8"):
        tl = replay(ctx, {"here": {n.name: p for n in sel}, "t4": t4_plan})
        assert tl.groups["here"].compute_ms == pytest.approx(sec.steps[key][p])
        # the whole gap is ready before the all-reduce: only the optimizer comes after it
        g = tl.groups["here"]
        assert g.forward_ms + g.backward_ms == pytest.approx(sec.steps[key][p] - 0.5)


def test_a_profile_without_whole_steps_is_incomplete(tmp_path):
    graph = mlp_graph(batch=1)
    path = tmp_path / "p.json"
    prof = _profile(graph.for_batch(16), env=ENV)
    del prof.find_section(ENV, 1).steps[_skey(graph.for_batch(16))]["int8"]
    prof.save(path)
    _, ctx = build_instance(load_spec(SPEC % path), graph, flat_omega(graph))
    assert "lacks" in ctx.group("here").cost_source and "[int8]" in ctx.group("here").cost_source


@pytest.mark.parametrize("version, lacks, reason", [
    (1, "steps", "whole training steps"),  # written before whole steps were measured
    (2, "dispatch", "raced"),  # its int8/int4 times are of the ruled dispatch
])
def test_an_older_profile_is_refused_with_the_reason(tmp_path, version, lacks, reason):
    path = tmp_path / "p.json"
    _profile(mlp_graph()).save(path)
    raw = json.loads(path.read_text())
    for s in raw["sections"].values():
        del s[lacks]
    path.write_text(json.dumps({**raw, "version": version}))
    with pytest.raises(ProfileError, match=f"version {version} .*{reason}.*profile SPEC") as e:
        load_profile(path)
    assert str(path) in str(e.value)


TWO_HERE = """
cluster:
  groups:
    - {name: a, device: cpu-local, env: {OMP_NUM_THREADS: "1"}}
    - {name: b, device: cpu-sse41, env: {OMP_NUM_THREADS: "1", ONEDNN_MAX_CPU_ISA: SSE41}}
model: {name: tiny-cnn}
training: {global_batch: 32, optimizer: adam}
"""


@pytest.mark.parametrize("extra_ms", [7.0, -5.0], ids=["ddp-slower", "ddp-faster"])
def test_the_measured_ddp_step_calibrates_the_replay(tmp_path, monkeypatch, extra_ms):
    """Both groups run here: the fp32 DDP step measured with every rank at once sets the uniform
    fp32 lockstep: an excess is charged once per iteration, a shortfall scales every op (the
    all-reduce, not scaled, is all that may differ), and the plan's notes say which."""
    from qsync_opt.training.predictor.allreduce_profile import ddp_key
    from qsync_opt.training.predictor.profile import default_profile_path
    from qsync_opt.training.predictor.replayer import replay

    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path))
    graph = mlp_graph(batch=1)
    spec = load_spec(TWO_HERE)
    alone = _profile(graph.for_batch(16), env=ENV)
    alone.sections.update(_profile(graph.for_batch(16), env={**ENV, "ONEDNN_MAX_CPU_ISA": "SSE41"}, offset=16).sections)
    alone.save(default_profile_path())
    _, ctx = build_instance(spec, graph, flat_omega(graph))  # timed alone: not what 2 ranks at once cost
    assert all("beside 1 other busy rank" in g.cost_source for g in ctx.groups), [g.cost_source for g in ctx.groups]
    prof = _profile(graph.for_batch(16), env=ENV, ranks=2)
    prof.sections.update(_profile(graph.for_batch(16), env={**ENV, "ONEDNN_MAX_CPU_ISA": "SSE41"}, ranks=2,
                                  offset=16).sections)
    prof.save(default_profile_path())
    _, ctx = build_instance(spec, graph, flat_omega(graph))
    fp32 = {g.name: {op: "fp32" for op in g.costs} for g in ctx.groups}
    parts = replay(ctx, fp32).iteration_ms
    assert not any("DDP term" in n for n in ctx.notes)

    comm = max(t.comm_ms for t in replay(ctx, fp32).groups.values())
    assert comm < 1.0  # so the check below can tell a scaled replay from an unscaled one
    prof.allreduce[ddp_key(spec)] = {"fp32_ms": parts + extra_ms}
    prof.save(default_profile_path())
    _, ctx = build_instance(spec, graph, flat_omega(graph))
    if extra_ms > 0:
        assert replay(ctx, fp32).iteration_ms == pytest.approx(parts + extra_ms)
        assert any(n.startswith(f"DDP term {extra_ms:.2f} ms per iteration") for n in ctx.notes), ctx.notes
    else:
        assert abs(replay(ctx, fp32).iteration_ms - (parts + extra_ms)) <= comm
        f = (parts + extra_ms) / parts
        assert any(n.startswith(f"DDP contention factor {f:.3f} on every op") for n in ctx.notes), ctx.notes

