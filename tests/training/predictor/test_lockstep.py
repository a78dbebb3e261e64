"""The program's time rows are the replayer's lockstep iteration (predictor/lockstep.py).

What a user relies on: a plan the replayer accepts is feasible in the program and the other
way round, so no baseline that meets the bound can beat the program's optimum.
"""

from __future__ import annotations

import random

import pytest
from predictor_graphs import SPEC_V100_T4, conv_chain_graph, deep_mlp_graph, flat_omega
from test_replayer_lockstep import CTX, PLAN

from qsync_opt.training.solving import baselines_of as _baselines
from qsync_opt.training.predictor.instance_builder import baseline, build_instance
from qsync_opt.training.predictor.lockstep import lockstep_rows
from qsync_opt.training.predictor.replayer import replay
from qsync_opt.training.refine import meets_time_bound
from qsync_opt.training.program.instance import evaluate, row_ms
from qsync_opt.training.program.solve import solve_instance
from qsync_opt.training.program.compile import compile_training
from qsync_opt.training.program.uniform import uniform_policy
from qsync_opt.training.spec import load_spec


def test_rows_of_the_hand_worked_timeline():
    # test_replayer_lockstep's docstring: bucket b (1 ms) waits for slow's b gradient at 8, bucket a
    # (3 ms) for slow's a gradient at 12; ends 15, then both optimizers (1 ms): iteration 16
    rows = lockstep_rows(CTX, CTX.groups)
    slow = [row_ms(r, PLAN["slow"]) for r in rows["slow"]]
    fast = [row_ms(r, PLAN["fast"]) for r in rows["fast"]]
    assert slow == pytest.approx([8 + 1 + 3 + 1, 12 + 3 + 1])  # ready + all-reduces from k on + optimizer
    assert fast == pytest.approx([4 + 1 + 3 + 1, 6 + 3 + 1])
    assert max(slow + fast) == pytest.approx(replay(CTX, PLAN).iteration_ms) == pytest.approx(16.0)


SPECS = {
    "auto": {},
    "number": {"objective.max_iteration_time": None},  # filled in per graph: between fastest and fp32
}


def _instances():
    out = []
    for gname, graph in (("conv", conv_chain_graph(batch=8, c=64, hw=56)), ("mlp", deep_mlp_graph(batch=32))):
        spec = load_spec(SPEC_V100_T4)
        out.append((f"{gname}-auto", *build_instance(spec, graph, flat_omega(graph))))
        inst, ctx = out[-1][1:]
        lo = replay(ctx, baseline(inst, "lowest")).iteration_ms
        hi = replay(ctx, baseline(inst, "highest")).iteration_ms
        for frac in (0.3, 0.7):
            spec = load_spec(SPEC_V100_T4, **{"objective.max_iteration_time": lo + frac * (hi - lo)})
            out.append((f"{gname}-bound{frac}", *build_instance(spec, graph, flat_omega(graph))))
    return out


CASES = _instances()


@pytest.mark.parametrize("name,inst,ctx", CASES, ids=[c[0] for c in CASES])
def test_program_time_is_the_replayed_lockstep_iteration(name, inst, ctx):
    assert len(ctx.groups[0].buckets) >= 2 or name.startswith("conv")
    rng = random.Random(0)
    for _ in range(40):
        a = {g.name: {op: rng.choice(ps) for op, ps in g.allowed.items()} for g in inst.groups}
        tl, ev = replay(ctx, a), evaluate(inst, a)
        assert ev.iteration_ms == pytest.approx(tl.iteration_ms, rel=1e-9)
        problem = compile_training(inst)
        program_ok = not problem.violated(problem.encode(a))
        replayer_ok = meets_time_bound(inst, tl.iteration_ms) and all(
            t.peak_memory_bytes <= g.mem_capacity_bytes for t, g in zip(tl.groups.values(), inst.groups))
        if abs(tl.iteration_ms - min(g.time_bound_ms or float("inf") for g in inst.groups)) > 1e-6:
            assert program_ok == replayer_ok == ev.feasible  # away from the boundary: the same verdict


@pytest.mark.parametrize("name,inst,ctx", CASES, ids=[c[0] for c in CASES])
def test_every_bound_meeting_baseline_is_feasible_in_the_program_and_never_beats_it(name, inst, ctx):
    problem = compile_training(inst)
    plans = {label: b.precisions for label, b in _baselines(inst, ctx).items()}
    try:
        plans["uniform"] = uniform_policy(inst)
    except Exception:  # noqa: BLE001 - no uniform plan meets the bound: nothing to compare
        pass
    meeting = {}
    for label, a in plans.items():
        tl = replay(ctx, a)
        if meets_time_bound(inst, tl.iteration_ms) and all(
                t.peak_memory_bytes <= g.mem_capacity_bytes for t, g in zip(tl.groups.values(), inst.groups)):
            violated = problem.violated(problem.encode(a))
            assert not violated, f"{label}: the replayer accepts it, the program does not: {violated[:3]}"
            meeting[label] = evaluate(inst, a).degradation
    assert meeting or not name.endswith("0.7"), "some baseline should meet a bound this loose"
    if meeting:
        r = solve_instance(inst, backend="highs", time_limit_s=30)
        assert r.status == "optimal"
        for label, deg in meeting.items():
            assert r.objective <= deg * (1 + 1e-6) + 1e-12, label


@pytest.mark.parametrize("name,inst,ctx", [c for c in CASES if c[0].startswith("conv")],
                         ids=[c[0] for c in CASES if c[0].startswith("conv")])
def test_program_optimum_equals_brute_force_on_the_zoo_graph(name, inst, ctx):
    from qsync_opt.errors import InfeasibleError
    from qsync_opt.training.program.brute import brute_force

    br = brute_force(inst)  # 3 selectable ops x 4 precisions per group: every plan enumerated
    try:
        r = solve_instance(inst, backend="highs", time_limit_s=30)
    except InfeasibleError:
        assert br.status == "infeasible"
        return
    assert br.status == "optimal" and r.objective == pytest.approx(br.objective, rel=1e-6, abs=1e-12)
