"""`training.batch_split: auto` against brute force over the same grid of splits.

A tiny CNN on a V100 beside a T4 at this runtime's fp32 boundary: at the even split the T4
cannot keep pace with the V100 at any precision, while splits that give it fewer samples can.
The referee solves every grid split exhaustively (solver/brute.py) under the definition in
qsync_opt/batch_split.py: each split's own bound, least objective, ties to the faster iteration.
"""

from dataclasses import replace

import pytest

from qsync_opt.training import solving
from qsync_opt.training.batch_split import candidate_splits, choose_split, pin_training_groups
from qsync_opt.errors import InfeasibleError, SolverError
from qsync_opt.training.pipeline import plan_training, prepare
from qsync_opt.training.solving import as_baseline, resolve_budget
from qsync_opt.training.predictor.instance_builder import build_instance
from qsync_opt.training.program.brute import brute_force
from qsync_opt.solver.budget import Budget
from qsync_opt.training.spec import load_spec

SPEC = {
    "name": "split",
    "cluster": {
        "groups": [
            {"name": "v100", "device": "V100-32GB", "role": "training"},
            {"name": "t4", "device": "T4"},
        ],
        "interconnect": "ethernet-100g",
    },
    "model": {"name": "tiny-cnn"},
    "training": {"global_batch": 256, "batch_split": "auto"},
    "solver": {"backend": "highs", "time_limit_s": 60},
    "runtime": {"boundary": "fp32"},
}
EDGE = {"runtime.boundary": "edge"}
"""QSync's cost model: lowering pays off, so the lightest feasible T4 share needs a lowered plan."""


@pytest.fixture(scope="module")
def prepared():
    return prepare(load_spec(SPEC))


def brute_over_grid(spec, prepared):
    """{split: (objective, replayed iteration ms) or None when infeasible}, by exhaustive enumeration."""
    _, ctx = build_instance(spec, prepared.graph, prepared.sensitivity, boundary=spec.runtime.boundary)
    fixed = pin_training_groups(spec, ctx.training_groups)
    out = {}
    for split in candidate_splits(spec):
        inst, c = build_instance(fixed, prepared.graph, prepared.sensitivity, local_batches=split,
                                 boundary=spec.runtime.boundary)
        b = brute_force(resolve_budget(fixed, inst))
        key = None
        if b.status == "optimal":
            key = (round(b.objective, 12), as_baseline(inst, c, b.assignment).iteration_ms)
        out[tuple(sorted(split.items()))] = key
    return out


@pytest.mark.parametrize("overrides", [{}, EDGE], ids=["fp32-boundary", "edge-boundary"])
def test_auto_finds_the_brute_force_split_when_the_even_split_is_infeasible(prepared, overrides):
    spec = load_spec(SPEC, **overrides)
    truth = brute_over_grid(spec, prepared)
    even = tuple(sorted(spec.local_batches().items()))
    assert truth[even] is None  # the premise: the even split cannot meet its bound
    feasible = {s: k for s, k in truth.items() if k is not None}
    assert feasible and len(feasible) < len(truth)  # ... and some, not all, others can
    best = min(feasible, key=feasible.get)
    chosen = choose_split(spec, prepared, Budget(60))
    assert tuple(sorted(chosen.local_batches.items())) == best
    assert any("grid splits feasible" in n for n in chosen.notes)


def test_auto_plan_meets_the_bound_of_its_own_split(prepared):
    spec = load_spec(SPEC, **EDGE)
    plan = plan_training(spec, prepared)
    assert plan.meets_bounds
    assert sum(g.local_batch * g.count for g in plan.groups.values()) == 256
    # max_iteration_time: auto -> the bound is the V100's own fp32 iteration at its chosen batch on the
    # lockstep clock: its last all-reduce, then the slowest group's optimizer step
    from dataclasses import replace

    from qsync_opt.training.predictor.instance_builder import build_instance
    from qsync_opt.training.predictor.replayer import replay

    _, ctx = build_instance(spec, prepared.graph, prepared.sensitivity,
                            local_batches={n: g.local_batch for n, g in plan.groups.items()}, boundary=spec.runtime.boundary)
    v100 = ctx.group("v100")
    alone = replay(replace(ctx, groups=(v100,)), {"v100": v100.highest})
    expect = max(alone.groups["v100"].compute_ms, alone.bucket_ends[-1] + max(g.optimizer_ms for g in ctx.groups))
    assert plan.groups["t4"].time_bound_ms == pytest.approx(expect, rel=1e-9)
    assert plan.iteration_ms <= plan.groups["t4"].time_bound_ms * (1 + 1e-6)  # the lockstep iteration


def test_infeasible_only_when_every_split_is_proven_infeasible(prepared):
    spec = load_spec(SPEC, **{"objective.max_iteration_time": 1e-3})  # below any group's fixed costs
    with pytest.raises(InfeasibleError, match=r"all \d+ splits on the grid proven infeasible"):
        choose_split(spec, prepared, Budget(60))


def test_no_time_left_is_unknown_not_infeasible(prepared):
    spec = load_spec(SPEC)
    spent = Budget(60, spent_s=60)
    with pytest.raises(SolverError, match="unknown, not infeasible") as err:
        choose_split(spec, prepared, spent)
    assert not isinstance(err.value, InfeasibleError)


def test_unsolved_splits_make_the_answer_unknown(prepared, monkeypatch):
    """A split whose solve ran out of time is not proven infeasible: with the only feasible
    splits unsolved, auto says unknown; with one solved, it says which and that others were not."""
    spec = load_spec(SPEC, **EDGE)
    truth = brute_over_grid(spec, prepared)
    feasible = {s for s, k in truth.items() if k is not None}
    real = solving.run_backend

    def timed_out_on(splits):
        def run(s, inst, budget=None):
            batches = {g.name: round(g.share * 256) for g in inst.groups}
            if tuple(sorted(batches.items())) in splits:
                raise SolverError("backend highs: no plan (unknown: time limit reached)")
            return real(s, inst, budget)
        return run

    monkeypatch.setattr(solving, "run_backend", timed_out_on(feasible))
    with pytest.raises(SolverError, match="unknown, not infeasible"):
        choose_split(spec, prepared, Budget(60))

    best = min(feasible, key=truth.get)
    monkeypatch.setattr(solving, "run_backend", timed_out_on(feasible - {best}))
    chosen = choose_split(spec, prepared, Budget(60))
    assert tuple(sorted(chosen.local_batches.items())) == best
    assert any("a better split may exist" in n for n in chosen.notes)


def test_numeric_bound_equal_to_the_training_groups_own_time_is_feasible(prepared):
    """The accuracy harness's 'joint' policy: bound = the training group's time at a hand-picked
    split (here one where the T4 must lower operators), so that group's pinned row is
    0 <= rounding noise there and must not prove infeasibility."""
    spec = load_spec(SPEC, **EDGE)
    truth = brute_over_grid(spec, prepared)
    lowered = [s for s, k in truth.items() if k is not None and k[0] > 0]
    assert lowered  # the premise: a feasible split that needs lowered operators
    split = dict(lowered[0])
    _, ctx = build_instance(spec, prepared.graph, prepared.sensitivity, local_batches=split,
                            boundary=spec.runtime.boundary)
    bounded = load_spec(SPEC, **EDGE, **{"objective.max_iteration_time": ctx.time_bound_ms})
    truth_b = brute_over_grid(bounded, prepared)
    assert truth_b[tuple(sorted(split.items()))] is not None
    chosen = choose_split(bounded, prepared, Budget(60))
    assert tuple(sorted(chosen.local_batches.items())) == min((s for s, k in truth_b.items() if k), key=truth_b.get)


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_pinned_group_exactly_at_its_own_bound_is_feasible(backend):
    """The cause of the harness's false 'infeasible': a pinned group whose time equals the bound
    up to rounding (0.1 + 0.2 > 0.3 by one ulp) left a variable-free row 0 <= -5.6e-17 that the
    linearisation counted as a proof; evaluate() and every solver accept it within tolerance."""
    from qsync_opt.training.program.instance import GroupInstance, TrainingInstance
    from qsync_opt.training.program.solve import solve_instance

    pinned = GroupInstance(name="strong", share=0.75, allowed={"a": ("fp32",)}, time_ms={"a": {"fp32": 0.2}},
                           mem_bytes={"a": {"fp32": 1.0}}, fixed_ms=0.1, time_bound_ms=0.3)
    free = GroupInstance(name="weak", share=0.25, allowed={"a": ("fp32", "fp16")},
                         time_ms={"a": {"fp32": 0.5, "fp16": 0.2}}, mem_bytes={"a": {"fp32": 1.0, "fp16": 0.5}},
                         fixed_ms=0.05, time_bound_ms=0.3)
    inst = TrainingInstance(groups=(pinned, free), omega={"a": {"fp32": 0.0, "fp16": 1e-3}})
    r = solve_instance(inst, backend=backend, time_limit_s=10)
    assert r.status == "optimal" and r.assignment == {"strong": {"a": "fp32"}, "weak": {"a": "fp16"}}
    with pytest.raises(InfeasibleError):  # a real excess is still a proof
        solve_instance(replace(inst, groups=(replace(pinned, time_bound_ms=0.29), free)), backend=backend)
