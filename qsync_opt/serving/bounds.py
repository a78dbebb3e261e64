"""Bounds on a serving program without solving it to the end, and brute force for the tests.

The planner enumerates device orders and micro-batch sizes; these bounds let it solve the
candidates best-first and skip the ones that cannot beat the plan it already has.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from qsync_opt.solver.backends import get_backend
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.serving.program import Assignment, ServingInstance, compile_serving, evaluate, stage_transfers_ms


def lower_bound(inst: ServingInstance) -> float:
    """A value no plan of `inst` beats, in closed form (used to skip candidates without solving).

    Every layer costs at least its cheapest (stage, bit) time, so Σ_j P_j ≥ Σ fixed + L·min pre;
    the slowest stage is no faster than the mean, max_j P_j ≥ Σ_j P_j / S; likewise for decode.
    """
    if inst.quality_only:
        return 0.0
    S, L, bits = len(inst.stages), inst.layers, inst.bits_allowed()
    cp, cd = stage_transfers_ms(inst)
    sum_p = sum(st.fixed_pre_ms for st in inst.stages) + L * min(st.pre_ms[b] for st in inst.stages for b in bits)
    sum_d = sum(st.fixed_dec_ms for st in inst.stages) + L * min(st.dec_ms[b] for st in inst.stages for b in bits)
    prefill = sum_p + cp + (inst.m_pre - 1) * max(sum_p / S, inst.comm_pre_ms)
    decode = inst.decode_rounds * max(inst.m_dec * max(sum_d / S, inst.comm_dec_ms), sum_d + cd)
    quality = sum(min(om[b] for b in bits) for om in inst.omega)
    return prefill + decode + inst.theta * quality


def relaxation_bound(inst: ServingInstance, backend: str = "highs", time_limit_s: float = 10.0) -> float:
    """The LP relaxation's optimum (integers made continuous): a bound that sees memory and quality.

    +inf when the relaxation is infeasible, which proves the program infeasible too; -inf when it
    was not solved to optimality within `time_limit_s` (no bound).
    """
    problem = compile_serving(inst)
    problem.variables = {v: replace(var, kind="continuous") for v, var in problem.variables.items()}
    problem.onehots = []  # per-layer form: the same rows as linear equalities
    for k, oh in enumerate(compile_serving(inst).onehots):
        problem.add_constraint(f"onehot_{k}", {v: 1.0 for v in oh.variables}, "==", 1.0)
    raw = get_backend(backend).solve(problem, SolveOptions(time_limit_s=time_limit_s, rel_gap=0.0))
    if raw.status == "infeasible":
        return float("inf")
    return raw.bound if raw.status == "optimal" and raw.bound is not None else -float("inf")


def brute_force(inst: ServingInstance) -> tuple[Assignment | None, float]:
    """Best plan by enumeration of every contiguous partition and bit vector (tests, ≤ ~8 layers)."""
    best, best_obj = None, float("inf")
    S, L = len(inst.stages), inst.layers
    for cuts in itertools.combinations(range(1, L), S - 1):
        sizes = tuple(b - a for a, b in zip((0, *cuts), (*cuts, L)))
        for bits in itertools.product(inst.bits_allowed(), repeat=L):
            a = Assignment(sizes, bits)
            ev = evaluate(inst, a)
            if not ev.violations and ev.objective < best_obj - 1e-12:
                best, best_obj = a, ev.objective
    return best, best_obj
