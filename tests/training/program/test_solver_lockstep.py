"""Sync rows (the lockstep iteration's bucket terms, instance.TimeRow) in every solver.

On random small instances with sync rows: the exact program's optimum equals brute force;
every baseline plan (greedy, QSync's allocator, uniform) that meets the bounds is feasible in
the compiled program and never beats its optimum; the rows survive the JSON export.
"""

from __future__ import annotations

import pytest
from solver_cases import rel_close

from qsync_opt.errors import InfeasibleError, SpecError
from qsync_opt.training.program.brute import brute_force
from qsync_opt.training.program.instance_io import instance_from_dict, instance_to_dict
from qsync_opt.training.program.greedy import greedy
from qsync_opt.training.program.instance import TimeRow, evaluate, group_time_ms, main_row_ms
from qsync_opt.training.program.qsync_greedy import qsync_greedy
from qsync_opt.training.program.random_instances import random_small, with_sync_rows
from qsync_opt.training.program.solve import solve_instance
from qsync_opt.training.program.compile import compile_training
from qsync_opt.training.program.uniform import uniform_policy
from dataclasses import replace

SEEDS = range(45)


@pytest.fixture(scope="module")
def cases():
    out = []
    for seed in SEEDS:
        inst = with_sync_rows(random_small(seed, n_ops=min(6, 2 + seed % 5)), seed)
        out.append((seed, inst, brute_force(inst)))
    return out


def test_rows_bind_somewhere(cases):
    """The rows matter: in some optimum a sync row, not the main row, sets a group's time."""
    binding = 0
    for _, inst, br in cases:
        if br.status == "optimal":
            for g in inst.groups:
                a = br.assignment[g.name]
                binding += group_time_ms(g, a) > main_row_ms(g, a) + 1e-9
    assert binding >= 10
    assert {br.status for _, _, br in cases} == {"optimal", "infeasible"}


def test_exact_program_equals_brute_force_with_sync_rows(cases):
    bad = []
    for seed, inst, br in cases:
        try:
            r = solve_instance(inst, backend="highs", time_limit_s=20)
        except InfeasibleError:
            if br.status != "infeasible":
                bad.append(f"seed {seed}: highs says infeasible, brute force {br.objective}")
            continue
        if br.status != "optimal" or not rel_close(r.objective, br.objective, 1e-6, 1e-12):
            bad.append(f"seed {seed}: highs {r.status} {r.objective}, brute force {br.status} {br.objective}")
        elif evaluate(inst, r.assignment).violations:
            bad.append(f"seed {seed}: plan breaks a row")
    assert not bad, "\n".join(bad)


def test_bound_meeting_baselines_are_feasible_in_the_program_and_never_beat_it(cases):
    checked = 0
    for seed, inst, br in cases:
        problem = compile_training(inst)
        plans = {"qsync": qsync_greedy(inst)}
        g = greedy(inst)
        if g.feasible:
            plans["greedy"] = g.assignment
        try:
            plans["uniform"] = uniform_policy(inst)
        except InfeasibleError:
            pass
        for label, a in plans.items():
            ev = evaluate(inst, a)
            if not ev.feasible:
                continue
            checked += 1
            assert not problem.violated(problem.encode(a)), f"seed {seed} {label}"
            assert br.status == "optimal", f"seed {seed}: {label} is a plan, brute force says infeasible"
            assert br.objective <= ev.objective(inst) * (1 + 1e-9) + 1e-12, f"seed {seed} {label}"
    assert checked >= 30


def test_sync_rows_survive_the_export(cases):
    _, inst, _ = next(c for c in cases if c[2].status == "optimal")
    back = instance_from_dict(instance_to_dict(inst))
    assert back.groups[0].sync_rows == inst.groups[0].sync_rows
    a = {g.name: {op: ps[-1] for op, ps in g.allowed.items()} for g in inst.groups}
    assert evaluate(back, a).time_ms == evaluate(inst, a).time_ms


def test_a_row_naming_an_unknown_op_is_refused():
    inst = random_small(1)
    g = inst.groups[0]
    bad = replace(g, sync_rows=(TimeRow("bucket 0", {"nope": {"fp32": 1.0}}),))
    with pytest.raises(SpecError, match=r"sync_rows\[0\].*'nope'"):
        compile_training(replace(inst, groups=(bad, *inst.groups[1:])))
