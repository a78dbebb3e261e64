"""kind: serving spec -> ServingPlan: enumerate device orders and micro-batch sizes, solve each program.

Micro-batch sizes change every cost coefficient and the number of micro-batches multiplies a
maximum, so they are enumerated outside the integer program (as in LLM-PQ), as are device
orders. With identical layers and one interconnect, a pipeline's predicted time and memory
depend on its order only through which device is first (it holds the embeddings and the LM
head), so an orderable pipeline tries each distinct device type first; with per-layer
indicators every distinct order of device types is tried (up to MAX_ORDERS).

The baselines are searched over the same candidates and scored by the same model; the best
baseline plan of a candidate is the warm start of its program, so the plan is never worse.

The caller's `Budget` (of `solver.time_limit_s`, made by `qsync_opt.solve`) bounds the whole
call: building the candidates, the relaxation bounds, every candidate's solve and the baselines
draw on it, each solve given at most what remains and charged its whole wall time (model building
included). The plan's search keeps `BASELINE_SHARE` of the limit for the baselines, which also get whatever the search leaves; a baseline the limit stops says so.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from qsync_opt.errors import InfeasibleError, SolverError, SpecError
from qsync_opt.serving.instance import COST_SOURCE, PipelineDevice, build, micro_batch_sizes
from qsync_opt.serving.profile import GroupCosts, measured_costs, measured_hops, serial_pipeline, stage_threads
from qsync_opt.serving.quality import layer_omegas
from qsync_opt.serving.plan import BaselineResult, Prediction, ServingPlan, SolverStats, Stage
from qsync_opt.solver.backends import EXACT, available
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.solver.budget import DEFAULT_TIME_LIMIT_S, Budget
from qsync_opt.serving.program import Assignment, Evaluation, ServingInstance, compile_serving, evaluate, solve_serving
from qsync_opt.serving.bounds import lower_bound, relaxation_bound
from qsync_opt.serving.baselines import adabits, uniform
from qsync_opt.serving.spec import ServingJob

MAX_ORDERS = 24
LP_BACKENDS = ("highs", "cbc", "scip")
"""Backends that solve a linear relaxation as an LP (CP-SAT would make it an integer program again)."""
DEFAULT = "highs"
BASELINE_SHARE = 0.2
"""Share of solver.time_limit_s the plan's search leaves to the baselines."""
RELAXATION_S = 10.0
"""At most this long for one candidate's LP relaxation."""
RELAXATION_SHARE_LEFT = 0.5
"""Share of the search's time the relaxation bounds leave to the candidates' solves (past it: closed-form bounds)."""
OUT_OF_TIME = "not solved (time limit)"


def expand(spec: ServingJob) -> list[PipelineDevice]:
    return [PipelineDevice(g.name, i, g.device_spec) for g in spec.cluster.groups for i in range(g.count)]


def candidate_orders(devices: list[PipelineDevice], orderable: bool, identical: bool) -> tuple[list[list[PipelineDevice]], str]:
    if not orderable or len(devices) == 1:
        return [devices], "the spec's order"
    key = lambda pd: (pd.device.name, pd.device.memory_gb)  # noqa: E731
    if identical:
        firsts, out = set(), []
        for k, pd in enumerate(devices):
            if key(pd) not in firsts:
                firsts.add(key(pd))
                out.append([pd] + devices[:k] + devices[k + 1:])
        return out, "each distinct device type first (identical layers: the rest of the order changes nothing)"
    seen, out = set(), []
    for perm in itertools.permutations(devices):
        sig = tuple(key(pd) for pd in perm)
        if sig not in seen:
            seen.add(sig)
            out.append(list(perm))
            if len(out) >= MAX_ORDERS:
                return out, f"the first {MAX_ORDERS} distinct device-type orders (more exist)"
    return out, "every distinct device-type order"


def plan_serving(job: ServingJob, budget: Budget, measured: Mapping[str, GroupCosts] | None = None) -> ServingPlan:
    """The serving plan of `job`; every solve it makes draws on `budget` (module docstring).

    `measured`: group name -> measured per-layer costs replacing the roofline on that group's devices;
    None: what `serving.costs` says (serving.profile.measured_costs: this machine's cached tables, or
    measured now under costs: measured)."""
    spec = job
    if spec.serving is None:
        raise SpecError("kind: serving needs a 'serving' section")
    s, sol = spec.serving, spec.solver
    backend = DEFAULT if sol.backend == "default" else sol.backend
    if backend not in EXACT:
        raise SpecError(f"solver.backend: {backend!r} cannot plan serving jobs; use one of {', '.join(EXACT)} or 'default'")
    if not available().get(backend):
        raise SpecError(f"solver.backend: {backend!r} is not available here; available: {[n for n, ok in available().items() if ok]}")
    cost_notes: list[str] = []
    hops = None
    if measured is None:  # before the clock: measuring is not solver time
        measured, cost_notes = measured_costs(spec)
        hops = measured_hops(spec)
        if hops is not None:
            cost_notes.append("stage-to-stage hops: measured (gloo between two local processes, serving/link.py), "
                              "not the interconnect's figures")
    serial = hops is not None and serial_pipeline(spec)
    if serial:
        cost_notes.append(f"micro-batches priced as not overlapping: the stages' {sum(stage_threads(spec))} threads "
                          f"fill this machine's {os.cpu_count()} CPUs, so a message that arrives while its receiver "
                          "computes waits for a core")
    t0 = time.perf_counter()
    devices = expand(spec)
    link = (spec.cluster.link.bandwidth_gbs, spec.cluster.link.latency_us)
    omega, quality_source = layer_omegas(s.model, list(s.bits), s.quality.stats, s.quality.indicator)
    identical = all(o == omega[0] for o in omega)
    orders, order_note = candidate_orders(devices, s.orderable, identical)
    pres, decs = micro_batch_sizes(s, "prefill"), micro_batch_sizes(s, "decode")
    candidates = [(o, bp, bd) for o in orders for bp in pres for bd in decs]
    notes = [
        f"objective: {s.objective} — the batch's end-to-end time is minimised either way "
        f"(tokens/s = {s.global_batch}·{s.gen_tokens} / that time); decode costed at the mean context {s.prompt_len + s.gen_tokens / 2:g}",
        f"device orders tried: {order_note}", f"micro-batch sizes tried: prefill {pres}, decode {decs}",
    ] + cost_notes

    def inst_for(order, bp, bd, bound):
        return build(s, order, bp, bd, omega, link, bound, measured, hops, serial)

    free = [inst_for(o, bp, bd, None) for o, bp, bd in candidates]
    bound, bound_note = _quality_bound(s, free)
    if bound_note:
        notes.append(bound_note)
    opts = SolveOptions(time_limit_s=budget.limit_s, rel_gap=sol.rel_gap, threads=sol.threads, seed=sol.seed)
    insts = [replace(i, max_indicator=bound) for i in free]
    budget.charge(time.perf_counter() - t0)  # the candidates' building counts too
    search = search_plans(insts, backend, opts, budget, keep_s=BASELINE_SHARE * budget.limit_s)
    wall = time.perf_counter() - t0
    baselines = search_baselines(insts, s, opts, budget)
    if search.best is None:
        diag = diagnose(spec, devices, pres, omega, bound, inst_for, budget)
        if search.statuses.get("infeasible", 0) == len(insts):
            raise InfeasibleError("no serving plan fits (every device order and micro-batch size proven infeasible)", diag)
        if diag:  # each line is a proof (memory arithmetic, or the least Σω solved to optimality)
            raise InfeasibleError("no serving plan fits", diag)
        # no plan and no proof: "unknown", never "infeasible"
        raise SolverError(f"no serving plan found within solver.time_limit_s = {budget.limit_s:g} s and none proven "
                          f"infeasible ({search.statuses}); fix: raise solver.time_limit_s (or --time-limit)")
    obj, inst, a, ev = search.best
    for b in baselines:  # a plan stopped within its gap may trail a baseline that meets the same bounds
        if not b.fits:
            continue
        bounded = replace(b._inst, max_indicator=bound, theta=s.quality.theta)  # baselines were searched without them
        bev = evaluate(bounded, b._a)
        if not bev.violations and bev.objective < obj:
            obj, inst, a, ev = bev.objective, bounded, b._a, bev
            notes.append(f"the {b.name} baseline beat the solver's plan within its gap and is returned")
    lower = min(search.lower, obj)
    gap = max(0.0, obj - lower) / max(abs(obj), 1e-12) if lower > -float("inf") else None
    # proven from valid bounds only: each candidate's solver bound, LP relaxation or closed-form bound
    status = "optimal" if gap is not None and gap <= max(sol.rel_gap, 1e-9) else "feasible"
    stats = SolverStats(
        backend=backend, status=status, objective_ms=obj, bound_ms=lower if lower > -float("inf") else None, gap=gap,
        rel_gap=sol.rel_gap, wall_s=wall, programs=len(insts) - search.pruned, pruned=search.pruned,
        statuses=search.statuses, form=compile_serving(inst).meta["form"],
        variables=search.stats.get("variables", 0), constraints=search.stats.get("constraints", 0),
    )
    return ServingPlan(
        name=spec.name, model=s.model.label, spec_digest=spec.digest(),
        workload={"global_batch": s.global_batch, "prompt_len": s.prompt_len, "gen_tokens": s.gen_tokens},
        stages=_stages(inst, a, ev), prefill_micro_batch=inst.meta["prefill_mb"], decode_micro_batch=inst.meta["decode_mb"],
        prediction=_prediction(s, ev), quality_bound=bound, quality_source=quality_source,
        cost_source=cost_source(spec, measured, hops is not None),
        solver=stats, baselines=[b.result for b in baselines], notes=notes,
    )


@dataclass
class Search:
    best: tuple | None = None
    """(objective, instance, assignment, evaluation) of the best plan found."""
    lower: float = float("inf")
    statuses: dict = field(default_factory=dict)
    pruned: int = 0
    stats: dict = field(default_factory=dict)


def search_plans(insts: list[ServingInstance], backend: str, opts: SolveOptions, budget: Budget,
                 keep_s: float = 0.0) -> Search:
    """Solve candidates best lower bound first; skip those whose bound cannot beat the incumbent.

    A candidate's bound is the larger of the closed-form `lower_bound` and its LP relaxation
    (which sees memory and the quality bound); an infeasible relaxation proves the candidate infeasible.
    Every solve draws on `budget`, leaving `keep_s` of it unspent; candidates the budget does not
    reach keep their bounds, unproven, under the status OUT_OF_TIME.
    """
    out = Search()
    lp = backend if backend in LP_BACKENDS else next((b for b in LP_BACKENDS if available().get(b)), None)
    bounds = []
    relax_keep = keep_s + RELAXATION_SHARE_LEFT * max(0.0, budget.remaining() - keep_s)  # solving needs time too
    for i in insts:
        rb = budget.timed("relaxation", min(RELAXATION_S, budget.remaining() - relax_keep),
                    lambda g: relaxation_bound(i, lp, g)) if lp else None
        bounds.append(max(lower_bound(i), -math.inf if rb is None else rb))
    for b in bounds:
        if b == float("inf"):  # the relaxation is infeasible: so is the program
            out.statuses["infeasible"] = out.statuses.get("infeasible", 0) + 1
    order = sorted((k for k in range(len(insts)) if bounds[k] < float("inf")), key=lambda k: bounds[k])
    for n, k in enumerate(order):
        inst, lb = insts[k], bounds[k]
        if out.best is not None and lb >= out.best[0]:
            out.pruned += len(order) - n  # sorted: every later candidate is bounded as well
            out.lower = min(out.lower, lb)
            break
        start = uniform(inst)
        res = budget.timed(f"candidate {k}", budget.remaining() - keep_s,
                     lambda g: solve_serving(inst, backend, replace(opts, time_limit_s=g), start=start))
        if res is None:  # out of time: the rest keep their bounds, unproven
            out.statuses[OUT_OF_TIME] = len(order) - n
            out.lower = min(out.lower, lb)
            break
        label = res.status + (" (scaled model)" if res.scaled else "")
        out.statuses[label] = out.statuses.get(label, 0) + 1
        out.stats = res.stats
        if res.status == "infeasible" and not res.scaled:
            continue
        # CP-SAT proves things about its integer-scaled, tightened copy: neither its bound nor its
        # "infeasible" holds for the real program, so such a candidate keeps its own valid bound.
        valid = res.bound if (res.bound is not None and not res.scaled) else -float("inf")
        out.lower = min(out.lower, max(lb, valid))
        if res.assignment is not None and (out.best is None or res.objective < out.best[0]):
            out.best = (res.objective, inst, res.assignment, res.evaluation)
    return out


@dataclass
class _Base:
    name: str
    result: BaselineResult
    _inst: ServingInstance | None = None
    _a: Assignment | None = None

    @property
    def fits(self) -> bool:
        return self._a is not None


def search_baselines(insts: list[ServingInstance], s, opts: SolveOptions, budget: Budget) -> list[_Base]:
    """Each baseline's best over the same candidates, scored by `evaluate` without the plan's quality terms.

    Their solves draw on the caller's `budget`; a baseline that it stops is reported with what it
    searched, or as not found within the limit."""
    backend = DEFAULT if available().get(DEFAULT) else next(n for n in EXACT if available().get(n))
    free = [replace(i, max_indicator=None, theta=0.0) for i in insts]
    out = []
    t = time.perf_counter()
    base = _uniform_baseline(free, s)
    base.result = base.result.model_copy(update={"solve_s": time.perf_counter() - t})
    out.append(base)
    t = time.perf_counter()
    bit = next((b for b in sorted(s.bits, reverse=True) if any(_fits_one_bit(i, b) for i in free)), None)
    picks, note = [], f"one bit-width ({bit}), partition searched exactly" if bit else ""
    if bit is not None:
        sub = search_plans([replace(i, allowed_bits=(bit,)) for i in free], backend, opts, budget)
        if sub.best is not None:
            picks = [(sub.best[1], sub.best[2])]
        if sub.statuses.get(OUT_OF_TIME):
            note += f"; solver.time_limit_s ran out with {sub.statuses[OUT_OF_TIME]} of {len(free)} candidates unsolved"
    out.append(_pick("pipeedge", picks, s, time.perf_counter() - t, key=lambda ev, a: (ev.e2e_ms,), note=note))
    t = time.perf_counter()
    picks, done, stopped = [], {}, [False]

    def solve(inst, backend, options, start=None):
        res = budget.timed("adabits", budget.remaining(),
                     lambda g: solve_serving(inst, backend, replace(options, time_limit_s=g), start=start))
        stopped[0] |= res is None
        return res

    for i in free:  # quality-only bits depend on the prefill micro-batch (activation memory) and order only
        key = (tuple(i.meta["order"]), i.meta["prefill_mb"])
        if key not in done and not stopped[0]:
            done[key] = adabits(i, backend, opts, solve=solve)
        if done.get(key) is not None:
            picks.append((i, done[key]))
    pairs = len({(tuple(i.meta["order"]), i.meta["prefill_mb"]) for i in free})
    note = f"solver.time_limit_s ran out after {len(done) - 1} of {pairs} (order, prefill micro-batch) pairs" if stopped[0] else ""
    out.append(_pick("adabits", picks, s, time.perf_counter() - t, key=lambda ev, a: (round(ev.quality, 9), ev.e2e_ms), note=note))
    return out


def _fits_one_bit(inst: ServingInstance, b: int) -> bool:
    """Whether some contiguous partition fits memory with every layer at `b` (each device ≥ 1 layer)."""
    room = [int((st.capacity_bytes - st.fixed_mem_bytes) // st.mem_bytes[b]) for st in inst.stages]
    return min(room) >= 1 and sum(room) >= inst.layers


def _pick(name, picks, s, wall, key, note="") -> _Base:
    best = None
    for inst, a in picks:
        if a is None:
            continue
        ev = evaluate(inst, a)
        if not ev.violations and (best is None or key(ev, a) < key(best[2], best[1])):
            best = (inst, a, ev)
    if best is None:
        why = (f"none found before solver.time_limit_s ran out ({note})" if "time_limit_s" in note
               else "nothing of this kind fits any candidate")
        return _Base(name, BaselineResult(name=name, fits=False, solve_s=wall, note=why))
    inst, a, ev = best
    res = BaselineResult(name=name, fits=True, prediction=_prediction(s, ev), stages=_stages(inst, a, ev), solve_s=wall,
                         prefill_micro_batch=inst.meta["prefill_mb"], decode_micro_batch=inst.meta["decode_mb"], note=note)
    return _Base(name, res, inst, a)


def _prediction(s, ev: Evaluation) -> Prediction:
    return Prediction(prefill_ms=ev.prefill_ms, decode_ms=ev.decode_ms, e2e_ms=ev.e2e_ms,
                      tokens_per_s=s.global_batch * s.gen_tokens / (ev.e2e_ms / 1e3), quality=ev.quality)


def _stages(inst: ServingInstance, a: Assignment, ev: Evaluation) -> list[Stage]:
    return [
        Stage(position=j, device=st.name, device_type=st.device, layers=rng, bits=list(a.bits[rng[0]:rng[1]]),
              prefill_ms=ev.stage_prefill_ms[j], decode_ms=ev.stage_decode_ms[j],
              memory_gb=ev.memory_bytes[j] / 1e9, capacity_gb=st.capacity_bytes / 1e9, cost_source=st.cost_source)
        for j, (st, rng) in enumerate(zip(inst.stages, a.ranges()))
    ]


def _uniform_baseline(free: list[ServingInstance], s) -> _Base:
    """The reported uniform baseline: the highest bit-width that fits some candidate (its order and
    micro-batch pair) under an even split, the fastest such candidate; `free` carries no quality terms."""
    return _pick("uniform", [(i, uniform(i)) for i in free], s, 0.0, key=lambda ev, a: (-a.bits[0], ev.e2e_ms))


def cost_source(job: ServingJob, measured: Mapping[str, GroupCosts], hops_measured: bool = False) -> str:
    """The plan's cost source: the roofline's description when no group is measured, else which groups are
    measured (and where the table came from), which stay on the roofline, and whether the hops are measured."""
    if not measured:
        return COST_SOURCE
    groups = job.cluster.groups
    meas = [g.name for g in groups if g.name in measured]
    where = sorted({measured[n].source for n in meas})
    roof = [g.name for g in groups if g.name not in measured]
    return (f"measured per layer for {', '.join(meas)} ({'; '.join(where)})"
            + (f"; roofline for {', '.join(roof)}" if roof else "")
            + ("; stage-to-stage hops measured; memory modelled" if hops_measured else "; memory and transfers modelled"))


def _quality_bound(s, free: list[ServingInstance]) -> tuple[float | None, str]:
    """The hard Σω bound; `uniform` is exactly the reported uniform baseline's Σω (same order and micro-batches)."""
    q = s.quality.max_indicator
    if q is None:
        return None, "quality: no hard bound" + (f", penalty θ = {s.quality.theta:g} ms per unit" if s.quality.theta else "")
    if q != "uniform":
        return float(q), f"quality: hard bound Σω ≤ {q:g}"
    base = _uniform_baseline(free, s)
    if not base.fits:
        return None, "quality: the uniform baseline fits at no bit-width, so no bound was set"
    bound = base.result.prediction.quality
    b, m = base._a.bits[0], base._inst.meta
    return bound, (f"quality: hard bound Σω ≤ {bound:.6g}, the uniform baseline's ({b}-bit everywhere, order "
                   f"{' > '.join(m['order'])}, micro-batches prefill {m['prefill_mb']} / decode {m['decode_mb']})")


def diagnose(spec: ServingJob, devices, pres, omega, bound, inst_for, budget: Budget) -> list[str]:
    """Which device cannot hold its share, by how much; or that the quality bound is out of reach.

    Every line is proven; its solves draw on `budget` (what the call has left) and are skipped when it is spent."""
    s = spec.serving
    inst = inst_for(devices, min(pres), min(pres), None)
    low = min(s.bits)
    per_layer = inst.stages[0].mem_bytes[low]
    lines, free = [], []
    for st in inst.stages:
        room = st.capacity_bytes - st.fixed_mem_bytes
        free.append(max(0.0, room))
        if room < per_layer:
            lines.append(
                f"{st.name} ({st.device}): one layer at {low} bits needs {per_layer / 1e9:.3g} GB (weights + KV cache) on top of "
                f"{st.fixed_mem_bytes / 1e9:.3g} GB activations/embeddings; capacity {st.capacity_bytes / 1e9:.3g} GB "
                f"(short by {(per_layer - room) / 1e9:.3g} GB)"
            )
    need = per_layer * inst.layers
    if need > sum(free):
        worst = max(range(len(free)), key=lambda j: -free[j])
        lines.append(
            f"the {inst.layers} layers need ≥ {need / 1e9:.4g} GB at {low} bits (KV cache for batch {s.global_batch}, "
            f"context {s.prompt_len + s.gen_tokens}); the devices have {sum(free) / 1e9:.4g} GB left after activations and "
            f"overhead (short by {(need - sum(free)) / 1e9:.4g} GB; tightest: {inst.stages[worst].name} with "
            f"{free[worst] / 1e9:.3g} GB)"
        )
    if not lines and bound is not None:
        for bp in pres:
            be = DEFAULT if available().get(DEFAULT) else EXACT[0]
            res = budget.timed("diagnosis", min(budget.remaining(), DEFAULT_TIME_LIMIT_S),
                               lambda g: solve_serving(replace(inst_for(devices, bp, bp, None), quality_only=True), be,
                                                       SolveOptions(time_limit_s=g)))
            if res is None:
                break
            if res.status == "optimal" and res.evaluation.quality > bound * (1 + 1e-9):
                lines.append(
                    f"quality: the least Σω that fits memory is {res.evaluation.quality:.6g} (prefill micro-batch {bp}), "
                    f"bound {bound:.6g} (over by {res.evaluation.quality - bound:.3g}); raise serving.quality.max_indicator"
                )
                break
    return lines
