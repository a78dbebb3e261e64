"""Serving planner (LLM-PQ): decoder layers -> contiguous pipeline stages, one bit-width per layer.

Given per-layer costs on each stage's device for fixed micro-batch sizes and a fixed device
order (both enumerated outside, see `serving_planner`), the plan's predicted time is

    prefill = Σ_j P_j + comm_p + (m_p − 1)·max(max_j (P_j + h_pj), c_p)
    decode  = rounds · max(m_d·max(max_j (D_j + h_dj), c_d), Σ_j D_j + S·c_d)

or, when micro-batches cannot overlap (`ServingInstance.serial`: a local pipeline whose stage threads
fill the machine's cores), prefill = m_p·(Σ_j P_j + comm_p) and the ring term is m_d·(Σ_j D_j + S·c_d)
    minimise prefill + decode + θ·Σ_i ω_i(b_i)

with P_j, D_j a stage's prefill / decode time for one micro-batch (its layers' times plus its
fixed terms: the embedding and LM head, or a measured stage call's fixed cost), m_p, m_d the
micro-batch counts, `rounds` the decode steps and h_pj, h_dj the time stage j's own thread spends
on one micro-batch's messages (zero where a hop is a wire; on a pipeline of processes sharing this
machine's CPU, the hop's cost at both its ends: `StageData.msg_*_ms`). A decode round ends when
the bottleneck stage has served all m_d micro-batches, or when one micro-batch has gone round the whole ring, whichever is later. Each max is an
epigraph variable; memory per device and the quality bound Σω ≤ budget are rows.

Two exact forms of the same program:

* per-layer: binary z[i, j, b], one (stage, bit) per layer, and contiguity rows saying that
  layer i+1 never sits on an earlier stage than layer i (LLM-PQ's form);
* aggregated, when every layer has the same ω (all costs are per layer and the layers are
  identical): integer n[j, b] = how many layers stage j holds at bit b. Any per-layer plan
  maps to counts with the same time, memory and quality; any counts unfold into a contiguous
  per-layer plan (stage after stage, any bit order inside a stage) with the same values. So
  both programs have the same optimum, with S·B integers instead of L·S·B binaries
  (tests/serving/test_serving_exact.py checks this on small cases). In this form only the
  first stage is special (it holds the embeddings and LM head), so identical devices after it
  can swap loads; one row per such neighbouring pair orders their count vectors, which
  removes those symmetric copies and no plan value.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from qsync_opt.errors import SolverError
from qsync_opt.solver.backends import get_backend
from qsync_opt.solver.backends.base import SolveOptions, Status
from qsync_opt.solver.problem import Problem

GB = 1e9
MEM_TOL = 1e-6
"""Relative slack when checking memory and quality rows (solver feasibility tolerance)."""


@dataclass(frozen=True)
class StageData:
    """One pipeline position: its device and the per-layer costs there, per bit-width."""

    name: str
    device: str
    pre_ms: dict[int, float]
    """Prefill time of one layer for one micro-batch, per bit."""
    dec_ms: dict[int, float]
    """Decode-step time of one layer for one micro-batch, per bit."""
    mem_bytes: dict[int, float]
    """Memory of one layer (weights at the bit-width + its KV cache), per bit."""
    fixed_pre_ms: float = 0.0
    fixed_dec_ms: float = 0.0
    fixed_mem_bytes: float = 0.0
    """Activations, and on stage 0 the embeddings and LM head."""
    capacity_bytes: float = float("inf")
    msg_pre_ms: float = 0.0
    msg_dec_ms: float = 0.0
    """Time the stage's own thread spends per micro-batch on its messages (receiving its input, sending its
    output), which its compute cannot overlap: on a pipeline of processes sharing this machine's CPU a hop is
    work (and a wake-up) of both the sender and the receiver, not a wire. Counted in the bottleneck (a stage
    serves m micro-batches of compute plus messages), not again in the ring (whose hops are comm_*_ms).
    Zero where hops are a wire (the roofline's interconnect)."""
    cost_source: str = "roofline"
    """'roofline' or 'measured': where pre_ms, dec_ms and the fixed times come from."""


@dataclass(frozen=True)
class ServingInstance:
    stages: tuple[StageData, ...]
    bits: tuple[int, ...]
    omega: tuple[dict[int, float], ...]
    """ω per layer per bit (len = number of layers)."""
    m_pre: int = 1
    m_dec: int = 1
    decode_rounds: int = 0
    comm_pre_ms: float = 0.0
    comm_dec_ms: float = 0.0
    max_indicator: float | None = None
    theta: float = 0.0
    allowed_bits: tuple[int, ...] | None = None
    """Restrict every layer to these bits (baselines)."""
    stage_sizes: tuple[int, ...] | None = None
    """Fix the number of layers per stage (baselines)."""
    quality_only: bool = False
    """Minimise Σω alone (time breaks ties): the AdaBits-style baseline."""
    serial: bool = False
    """Micro-batches do not overlap: each goes through every stage alone, so prefill = m_p·(Σ_j P_j + comm_p)
    and a decode round is at least m_d·(Σ_j D_j + S·c_d). So it is on a pipeline of local processes whose stage
    threads fill this machine's cores: a message that arrives while its receiver computes waits for a core to
    run the receiving thread, and the other micro-batches' compute no longer hides it."""
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def layers(self) -> int:
        return len(self.omega)

    @property
    def identical_layers(self) -> bool:
        return all(o == self.omega[0] for o in self.omega)

    def bits_allowed(self) -> tuple[int, ...]:
        return tuple(b for b in self.bits if self.allowed_bits is None or b in self.allowed_bits)


@dataclass(frozen=True)
class Assignment:
    sizes: tuple[int, ...]
    """Layers per stage, in pipeline order."""
    bits: tuple[int, ...]
    """Bit-width per layer, in layer order."""

    def ranges(self) -> list[tuple[int, int]]:
        out, start = [], 0
        for n in self.sizes:
            out.append((start, start + n))
            start += n
        return out


@dataclass(frozen=True)
class Evaluation:
    prefill_ms: float
    decode_ms: float
    stage_prefill_ms: tuple[float, ...]
    stage_decode_ms: tuple[float, ...]
    memory_bytes: tuple[float, ...]
    quality: float
    objective: float
    violations: tuple[str, ...]

    @property
    def e2e_ms(self) -> float:
        return self.prefill_ms + self.decode_ms


def stage_transfers_ms(inst: ServingInstance) -> tuple[float, float]:
    """(prefill transfer total for one micro-batch, decode ring transfer total) over stage boundaries."""
    s = len(inst.stages)
    if s == 1:
        return 0.0, 0.0
    return (s - 1) * inst.comm_pre_ms + inst.comm_dec_ms, s * inst.comm_dec_ms


def evaluate(inst: ServingInstance, a: Assignment) -> Evaluation:
    """The plan's predicted times, memory and quality, computed directly (no solver)."""
    bad: list[str] = []
    if len(a.sizes) != len(inst.stages) or sum(a.sizes) != inst.layers or len(a.bits) != inst.layers:
        raise SolverError(f"assignment shape {a.sizes}/{len(a.bits)} does not fit {len(inst.stages)} stages, {inst.layers} layers")
    pre, dec, mem = [], [], []
    for st, (lo, hi) in zip(inst.stages, a.ranges()):
        if hi == lo:
            bad.append(f"{st.name}: no layers (every device must hold at least one)")
        bs = a.bits[lo:hi]
        pre.append(st.fixed_pre_ms + sum(st.pre_ms[b] for b in bs))
        dec.append(st.fixed_dec_ms + sum(st.dec_ms[b] for b in bs))
        mem.append(st.fixed_mem_bytes + sum(st.mem_bytes[b] for b in bs))
        if mem[-1] > st.capacity_bytes + MEM_TOL * max(GB, abs(st.capacity_bytes)):
            bad.append(f"{st.name}: memory {mem[-1] / GB:.3f} GB over capacity {st.capacity_bytes / GB:.3f} GB")
    allowed = inst.bits_allowed()
    if any(b not in allowed for b in a.bits):
        bad.append(f"bits {sorted(set(a.bits) - set(allowed))} not allowed (allowed {list(allowed)})")
    if inst.stage_sizes is not None and tuple(a.sizes) != tuple(inst.stage_sizes):
        bad.append(f"stage sizes {a.sizes} differ from the fixed {inst.stage_sizes}")
    quality = sum(om[b] for om, b in zip(inst.omega, a.bits))
    if inst.max_indicator is not None and quality > inst.max_indicator * (1 + MEM_TOL) + 1e-12:
        bad.append(f"quality Σω {quality:.6g} over the bound {inst.max_indicator:.6g}")
    cp, cd = stage_transfers_ms(inst)
    busy_pre = max(p + st.msg_pre_ms for p, st in zip(pre, inst.stages))
    busy_dec = max(d + st.msg_dec_ms for d, st in zip(dec, inst.stages))
    if inst.serial:
        prefill = inst.m_pre * (sum(pre) + cp)
        ring = inst.m_dec * (sum(dec) + cd)
    else:
        prefill = sum(pre) + cp + (inst.m_pre - 1) * max(busy_pre, inst.comm_pre_ms)
        ring = sum(dec) + cd
    decode = inst.decode_rounds * max(inst.m_dec * max(busy_dec, inst.comm_dec_ms), ring)
    objective = quality if inst.quality_only else prefill + decode + inst.theta * quality
    return Evaluation(prefill, decode, tuple(pre), tuple(dec), tuple(mem), quality, objective, tuple(bad))


# ---------------------------------------------------------------------------- the program
def compile_serving(inst: ServingInstance, aggregate: bool | None = None) -> Problem:
    """The integer program of `inst`; `aggregate=None` aggregates whenever the layers are identical."""
    if aggregate is None:
        aggregate = inst.identical_layers
    if aggregate and not inst.identical_layers:
        raise SolverError("compile_serving: aggregate=True needs identical layers (the same ω for every layer)")
    S, L, bits = len(inst.stages), inst.layers, inst.bits_allowed()
    if not bits:
        raise SolverError("compile_serving: no bit-width allowed")
    p = Problem(name=f"serving_{'agg' if aggregate else 'layer'}", meta={"form": "aggregated" if aggregate else "per-layer"})
    # count[j, b]: the linear expression "layers on stage j at bit b" in either form
    count: dict[tuple[int, int], dict[str, float]] = {}
    qual: dict[str, float] = {}
    if aggregate:
        for j in range(S):
            for b in bits:
                v = p.add_var(f"n_s{j}_b{b}", "integer", 0, L)  # layers of stage j at bit b
                count[j, b] = {v: 1.0}
                qual[v] = inst.omega[0][b]
        p.add_constraint("all_layers", {v: 1.0 for c in count.values() for v in c}, "==", L)
        # Identical devices after the first hold interchangeable loads: order them by a key that
        # encodes the whole count vector (base L+1 digits), which removes only symmetric copies.
        for j in range(1, S - 1):
            if _same_device(inst.stages[j], inst.stages[j + 1]):
                row = {}
                for r, b in enumerate(bits):
                    row[f"n_s{j}_b{b}"] = float((L + 1) ** r)
                    row[f"n_s{j + 1}_b{b}"] = -float((L + 1) ** r)
                p.add_constraint(f"symmetry_s{j}", row, ">=", 0.0)
    else:
        for i in range(L):
            zs = []
            for j in range(S):
                for b in bits:
                    v = p.add_var(f"z_l{i}_s{j}_b{b}")  # layer i on stage j at bit b
                    p.choices[v] = (inst.stages[j].name, f"layer{i}", str(b))
                    count.setdefault((j, b), {})[v] = 1.0
                    qual[v] = inst.omega[i][b]
                    zs.append(v)
            p.add_onehot(f"place_l{i}", zs)
        for i in range(L - 1):  # stage(i+1) ≥ stage(i): prefix sums over stages never grow
            for j in range(S - 1):
                row = {f"z_l{i + 1}_s{k}_b{b}": 1.0 for k in range(j + 1) for b in bits}
                for k in range(j + 1):
                    for b in bits:
                        row[f"z_l{i}_s{k}_b{b}"] = row.get(f"z_l{i}_s{k}_b{b}", 0.0) - 1.0
                p.add_constraint(f"order_l{i}_s{j}", row, "<=", 0.0)

    def stage_expr(j: int, per_bit: dict[int, float], scale: float = 1.0) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in bits:
            for v in count[j, b]:
                out[v] = out.get(v, 0.0) + scale * per_bit[b]
        return out

    for j, st in enumerate(inst.stages):
        size = stage_expr(j, {b: 1.0 for b in bits})
        if inst.stage_sizes is not None:
            p.add_constraint(f"size_s{j}", size, "==", inst.stage_sizes[j])
        else:
            p.add_constraint(f"nonempty_s{j}", size, ">=", 1)
        p.add_constraint(f"mem_s{j}", stage_expr(j, st.mem_bytes, 1 / GB), "<=", (st.capacity_bytes - st.fixed_mem_bytes) / GB)
    if inst.max_indicator is not None:
        p.add_constraint("quality", qual, "<=", inst.max_indicator)

    cp, cd = stage_transfers_ms(inst)
    obj: dict[str, float] = {}

    def add(coeffs: dict[str, float], scale: float) -> None:
        for v, c in coeffs.items():
            obj[v] = obj.get(v, 0.0) + scale * c

    time_scale = 1e-6 if inst.quality_only else 1.0  # quality-only: time only breaks ties
    pre_scale = inst.m_pre if inst.serial else 1  # serial: every prefill micro-batch passes every stage alone
    for j, st in enumerate(inst.stages):
        add(stage_expr(j, st.pre_ms), pre_scale * time_scale)
    if inst.m_pre > 1 and not inst.serial:
        t = p.add_var("t_pre_max", "continuous", inst.comm_pre_ms, float("inf"))  # slowest stage's prefill
        for j, st in enumerate(inst.stages):
            p.add_constraint(f"pre_max_s{j}", {t: 1.0, **stage_expr(j, st.pre_ms, -1.0)}, ">=",
                             st.fixed_pre_ms + st.msg_pre_ms)
        add({t: 1.0}, (inst.m_pre - 1) * time_scale)
    if inst.decode_rounds > 0:
        r = p.add_var("t_round", "continuous", inst.m_dec * inst.comm_dec_ms, float("inf"))  # one decode round
        for j, st in enumerate(inst.stages):
            row = {r: 1.0, **stage_expr(j, st.dec_ms, -float(inst.m_dec))}
            p.add_constraint(f"round_bottleneck_s{j}", row, ">=", inst.m_dec * (st.fixed_dec_ms + st.msg_dec_ms))
        k = float(inst.m_dec) if inst.serial else 1.0  # serial: every micro-batch goes round the ring alone
        ring = {r: 1.0}
        for j, st in enumerate(inst.stages):
            for v, c in stage_expr(j, st.dec_ms, -k).items():
                ring[v] = ring.get(v, 0.0) + c
        p.add_constraint("round_ring", ring, ">=", k * (sum(st.fixed_dec_ms for st in inst.stages) + cd))
        add({r: 1.0}, inst.decode_rounds * time_scale)
    add(qual, 1.0 if inst.quality_only else inst.theta)
    p.objective = {v: c for v, c in obj.items() if c != 0}
    p.objective_constant = time_scale * pre_scale * (sum(st.fixed_pre_ms for st in inst.stages) + cp)
    return p


def _same_device(a: StageData, b: StageData) -> bool:
    return (a.device, a.pre_ms, a.dec_ms, a.mem_bytes, a.fixed_pre_ms, a.fixed_dec_ms, a.fixed_mem_bytes, a.capacity_bytes,
            a.msg_pre_ms, a.msg_dec_ms) == (
        b.device, b.pre_ms, b.dec_ms, b.mem_bytes, b.fixed_pre_ms, b.fixed_dec_ms, b.fixed_mem_bytes, b.capacity_bytes,
        b.msg_pre_ms, b.msg_dec_ms)


def decode_values(inst: ServingInstance, problem: Problem, values: dict[str, float]) -> Assignment:
    """Assignment from solver values of either form."""
    S, bits = len(inst.stages), inst.bits_allowed()
    if problem.meta.get("form") == "aggregated":
        sizes, per_layer = [], []
        for j in range(S):
            n = {b: int(round(values.get(f"n_s{j}_b{b}", 0.0))) for b in bits}
            sizes.append(sum(n.values()))
            for b in sorted(bits, reverse=True):  # identical layers: any order inside a stage
                per_layer += [b] * n[b]
        return Assignment(tuple(sizes), tuple(per_layer))
    where: dict[int, tuple[int, int]] = {}
    for i in range(inst.layers):
        for j in range(S):
            for b in bits:
                if values.get(f"z_l{i}_s{j}_b{b}", 0.0) > 0.5:
                    where[i] = (j, b)
    if len(where) != inst.layers:
        raise SolverError("solution leaves a layer unplaced")
    stage_of = [where[i][0] for i in range(inst.layers)]
    return Assignment(tuple(stage_of.count(j) for j in range(S)), tuple(where[i][1] for i in range(inst.layers)))


def encode(inst: ServingInstance, problem: Problem, a: Assignment) -> dict[str, float]:
    """Complete variable values of `a` (a warm start)."""
    values: dict[str, float] = {}
    for j, (lo, hi) in enumerate(a.ranges()):
        for i in range(lo, hi):
            if problem.meta.get("form") == "aggregated":
                key = f"n_s{j}_b{a.bits[i]}"
                values[key] = values.get(key, 0.0) + 1.0
            else:
                values[f"z_l{i}_s{j}_b{a.bits[i]}"] = 1.0
    for v, var in problem.variables.items():
        if var.kind != "continuous":
            values.setdefault(v, 0.0)
    return problem.complete(values)


@dataclass(frozen=True)
class ServingSolve:
    status: Status
    assignment: Assignment | None
    evaluation: Evaluation | None
    objective: float | None
    bound: float | None
    wall_s: float
    backend: str
    message: str = ""
    stats: dict = field(default_factory=dict)
    scaled: bool = False
    """The backend solved a rounded, tightened copy (CP-SAT): its status and bound are about that copy."""


def solve_serving(inst: ServingInstance, backend: str = "highs", options: SolveOptions | None = None,
                  start: Assignment | None = None, aggregate: bool | None = None) -> ServingSolve:
    """Solve one (order, micro-batch) program; the plan is re-scored by `evaluate` and must hold."""
    options = options or SolveOptions()
    problem = compile_serving(inst, aggregate)
    if start is not None and not evaluate(inst, start).violations:
        hint = encode(inst, problem, start)
        if not problem.violated(hint):
            options = replace(options, hint=hint)
    raw = get_backend(backend).solve(problem, options)
    if raw.status not in ("optimal", "feasible") or raw.values is None:
        return ServingSolve(raw.status, None, None, None, raw.bound, raw.wall_s, backend, raw.message, problem.stats(),
                            raw.scaling is not None)
    a = decode_values(inst, problem, raw.values)
    ev = evaluate(inst, a)
    if ev.violations:
        raise SolverError(f"backend {backend} returned a serving plan that breaks the instance: {'; '.join(ev.violations)}")
    return ServingSolve(raw.status, a, ev, ev.objective, raw.bound, raw.wall_s, backend, raw.message, problem.stats(),
                        raw.scaling is not None)
