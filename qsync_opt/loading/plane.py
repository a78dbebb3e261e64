"""The central data plane: the only copy of every source's cursor and index, a deterministic
weighted mix, the balancer, and the per-rank sample ids of each global batch.

Mixing (Megatron's blending rule with a schedule): for every slot of a global batch each
source's deficit grows by its normalised weight at this step, the source with the largest
deficit (ties: first listed) gives the next sample and its deficit drops by one, so counts
track the weights within one sample at any point; the batch's slots are then shuffled by
(seed, step), so that no rank receives the blend's fixed pattern. Within a source, samples come in the
order of a permutation drawn per epoch from (seed, source, epoch): the state to resume is
(step, per-source epoch and cursor, deficits) and nothing else; the permutation is
recomputed, not stored.

The split is reproducible: the heuristics are integer and tie-broken on index, and the exact
stage runs CP-SAT on one thread under a deterministic work budget (`work_limit`); only if
its wall-clock backstop fires first (flagged in `StepPlan.detail['time_limited']`) can a
rerun split that batch differently, and then only over ranks: the samples of each global
batch, and so the gradient (the loss is normalised globally), do not depend on the split.

The ranks only receive their ids (`StepPlan.rank_ids(r)`); they read, pad and run them, and
normalise their loss by the global token count (`loading.collate`).

Off the critical path (`prefetch=True`): as soon as `next_batch` hands out step t's plan, the
plane draws step t+1's samples (the mix is deterministic, so they are the same as without
prefetch) and plans them on a background thread while step t runs; the next `next_batch` only
waits for what is left. Each plan reports both costs: `plan_s` (the planning itself, wherever it
ran) and `wait_s` (what `next_batch` kept its caller waiting: the critical path). A prefetched
plan is made with the cost model and speeds of the moment step t's plan was handed out; if they
change before step t+1 is asked for, its `predicted` loads are recomputed with the new ones and
`detail['planned_with_previous_model']` says so (the split stays the prefetched one).
`state_dict` always describes the steps handed out, never the prefetched one.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from qsync_opt.data.sources import piecewise
from qsync_opt.errors import SpecError
from qsync_opt.loading import balance as B
from qsync_opt.loading.cost import CostModel

POLICIES = ("stride", "tokens-kk", "verl-kk", "tokens", "ours")
"""stride: DistributedSampler's split; tokens-kk / verl-kk: Karmarkar-Karp on L / on c(L),
speeds ignored (verl's seqlen_balancing); tokens / ours: the speed-aware balancer on L / on c(L)."""
SPEC_POLICY = {"none": "stride", "tokens": "tokens", "attention": "ours"}
STATE_VERSION = 1
MIN_GAIN_S = 0.010
"""Default `min_gain_s`: about what the exact stage costs at the default work budget (CP-SAT,
0.02 deterministic seconds) on one CPU core (docs/loading.md, "Balancer", has the measurement)."""


def source_permutation(seed: int, source: int, epoch: int, size: int) -> np.ndarray:
    """The order in which source position `source` (of `size` samples) gives its samples in `epoch`."""
    return np.random.default_rng([seed, source, epoch]).permutation(size)


def source_stream(seed: int, source: int, size: int, epoch: int, cursor: int, n: int) -> list[int]:
    """The next `n` sample indices a source gives from (epoch, cursor), its place in a checkpointed
    state: what the plane's mix draws from it, wrapping into later epochs."""
    out: list[int] = []
    while len(out) < n:
        perm = source_permutation(seed, source, epoch, size)
        take = min(n - len(out), size - cursor)
        out.extend(int(x) for x in perm[cursor:cursor + take])
        cursor += take
        if cursor == size:
            epoch, cursor = epoch + 1, 0
    return out


@dataclass(frozen=True)
class SourceIndex:
    """What the coordinator knows of a source: its name, every sample's length, its weight schedule."""

    name: str
    lengths: np.ndarray
    schedule: tuple[tuple[int, float], ...] = ((0, 1.0),)

    def weight_at(self, step: int) -> float:
        return piecewise(self.schedule, step)

    @property
    def nbytes(self) -> int:
        return int(self.lengths.nbytes)


@dataclass
class StepPlan:
    step: int
    samples: list[tuple[int, int]]
    """(source position, sample index) for every slot of the global batch, in mix order."""
    lengths: list[int]
    owner: list[int]
    """Rank of every slot."""
    predicted: list[float]
    """Σ c(L)/speed per rank (or Σ c_r(L) with per-rank cost models), in the cost model's unit."""
    method: str
    status: str
    gap: float
    plan_s: float
    """Seconds spent planning this step (on a background thread when prefetched)."""
    detail: dict = field(default_factory=dict)
    wait_s: float = 0.0
    """Seconds `next_batch` kept its caller waiting for this plan (mix and planning, or, when it
    was prefetched, what was left of them): the planner's share of the step's critical path."""

    @property
    def global_tokens(self) -> int:
        return int(sum(self.lengths))

    def rank_slots(self, r: int) -> list[int]:
        return [i for i, o in enumerate(self.owner) if o == r]

    def rank_ids(self, r: int) -> list[tuple[int, int]]:
        return [self.samples[i] for i in self.rank_slots(r)]


class DataPlane:
    def __init__(self, sources: Sequence[SourceIndex], *, global_batch: int, speeds: Sequence[float],
                 policy: str = "ours", cost: CostModel | Sequence[CostModel] | None = None, token_cap: int | None = None,
                 equal_counts: bool = False, seed: int = 0, backend: str | None = "cpsat",
                 time_limit_s: float = 1.0, work_limit: float | None = 0.02, gap_tol: float = 1e-2,
                 min_gain_s: float = MIN_GAIN_S, prefetch: bool = False):
        if not sources:
            raise SpecError("data.sources: the data plane needs at least one source")
        if global_batch < 1:
            raise SpecError(f"global_batch must be >= 1, got {global_batch}")
        if policy not in POLICIES:
            raise SpecError(f"data plane policy {policy!r} unknown; use one of {', '.join(POLICIES)}")
        for s in sources:
            if len(s.lengths) == 0:
                raise SpecError(f"data.sources: source {s.name!r} has no samples")
        self.sources = list(sources)
        self.global_batch = int(global_batch)
        self.speeds = [float(x) for x in speeds]
        self.policy = policy
        self.cost = cost or CostModel.tokens()
        """One c(L) for every rank (divided by each rank's speed), or one c(L) per rank (its own curve)."""
        self.token_cap, self.equal_counts = token_cap, bool(equal_counts)
        self.seed = int(seed)
        self.backend, self.time_limit_s, self.gap_tol = backend, float(time_limit_s), float(gap_tol)
        self.work_limit = work_limit if backend == "cpsat" else None
        if backend is not None and policy in ("tokens", "ours"):
            B.load_solver(backend)  # at start-up, not inside a step's time limit
        self.min_gain_s = float(min_gain_s)
        """With cost curves in seconds, the exact stage runs only when the heuristic split's slowest
        rank could be more than this above the optimum (its lower bound): below, it would cost more
        on the critical path than it could win. Token and FLOP costs ignore it."""
        self.prefetch = bool(prefetch)
        """Plan step t+1 on a background thread while step t runs (module docstring)."""
        self._pending = None  # (state before the prefetched draw, samples, lengths, model, future)
        self._pool: ThreadPoolExecutor | None = None
        self.step = 0
        self.epoch = [0] * len(self.sources)
        self.cursor = [0] * len(self.sources)
        self.deficit = [0.0] * len(self.sources)
        self._perm: list[np.ndarray | None] = [None] * len(self.sources)

    # ---- sampling -------------------------------------------------------------------------
    def _permutation(self, s: int) -> np.ndarray:
        if self._perm[s] is None:
            self._perm[s] = source_permutation(self.seed, s, self.epoch[s], len(self.sources[s].lengths))
        return self._perm[s]

    def weights(self, step: int) -> list[float]:
        w = [src.weight_at(step) for src in self.sources]
        total = sum(w)
        if not total > 0:
            raise SpecError(f"data.sources: every weight is zero at step {step}; give one source a positive weight there")
        return [x / total for x in w]

    def _mix(self) -> list[tuple[int, int]]:
        p = self.weights(self.step)
        out = []
        for _ in range(self.global_batch):
            for i, pi in enumerate(p):
                self.deficit[i] += pi
            s = max((i for i in range(len(p)) if p[i] > 0), key=lambda i: (self.deficit[i], -i))
            self.deficit[s] -= 1.0
            perm = self._permutation(s)
            out.append((s, int(perm[self.cursor[s]])))
            self.cursor[s] += 1
            if self.cursor[s] == len(perm):
                self.epoch[s] += 1
                self.cursor[s] = 0
                self._perm[s] = None
        # the blend's fixed pattern (every 4th slot long at 3:1) would hand an order-based split
        # the same slots every step; a per-step shuffle from (seed, step) removes it
        order = np.random.default_rng([self.seed, 0x5107, self.step]).permutation(len(out))
        return [out[i] for i in order]

    # ---- one global batch -----------------------------------------------------------------
    def next_batch(self) -> StepPlan:
        t0 = time.perf_counter()
        if self._pending is not None:
            _, samples, lengths, model, fut = self._pending
            self._pending = None
            plan = fut.result()
            if model != self._model():  # refitted since the prefetch started: predict with the new model
                plan.predicted = self._predicted(lengths, plan.owner, self._model())
                plan.detail["planned_with_previous_model"] = True
        else:
            samples = self._mix()
            lengths = [int(self.sources[s].lengths[i]) for s, i in samples]
            plan = self.assign(lengths)
        plan.step, plan.samples = self.step, samples
        self.step += 1
        plan.wait_s = time.perf_counter() - t0
        if self.prefetch:
            self._prefetch_next()
        return plan

    def _model(self):
        return (self.cost if not isinstance(self.cost, list) else tuple(self.cost), tuple(self.speeds))

    def _prefetch_next(self) -> None:
        saved = self.state_dict()
        samples = self._mix()
        lengths = [int(self.sources[s].lengths[i]) for s, i in samples]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plane-prefetch")
        model = self._model()
        self._pending = (saved, samples, lengths, model, self._pool.submit(self.assign, lengths, model=model))

    def close(self) -> None:
        """Drop a prefetched plan (rewinding the mix to before its draw) and stop the background
        thread; a later `next_batch` plans inline, or prefetches again with `prefetch` still on."""
        self._drop_pending()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _drop_pending(self) -> None:
        """Forget the prefetched step and rewind the mix to before its draw."""
        if self._pending is not None:
            saved, fut = self._pending[0], self._pending[-1]
            fut.cancel()
            self._pending = None
            self.step = int(saved["step"])
            self.epoch = [int(x["epoch"]) for x in saved["sources"]]
            self.cursor = [int(x["cursor"]) for x in saved["sources"]]
            self.deficit = [float(x) for x in saved["deficit"]]
            self._perm = [None] * len(self.sources)

    def assign(self, lengths: Sequence[int], policy: str | None = None, cost: CostModel | None = None, *,
               model=None) -> StepPlan:
        """Split one global batch of these lengths over the ranks by `policy` (default: the plane's),
        `cost` (default: the plane's) being the cost that policy balances; `predicted` is always
        in the plane's cost model and speeds (or `model`, a (cost model(s), speeds) pair taken
        earlier: the prefetch plans with the model of the moment it started)."""
        policy = policy or self.policy
        plane_cost, speeds = model if model is not None else self._model()
        plane_cost = list(plane_cost) if isinstance(plane_cost, tuple) else plane_cost
        speeds = list(speeds)
        k = len(speeds)
        per_rank = isinstance(plane_cost, (list, tuple))
        if per_rank and len(plane_cost) != k:
            raise SpecError(f"data plane: {len(plane_cost)} cost models for {k} ranks; "
                            "give one per rank or one for all")
        t0 = time.perf_counter()
        base = cost or (plane_cost[0] if per_rank else plane_cost)
        costs = base.costs(lengths)
        status, gap, detail = "feasible", float("nan"), {}
        if policy == "stride":
            owner, method = B.stride(len(lengths), k), "stride"
        elif policy in ("tokens-kk", "verl-kk"):
            owner = B.kk_parts([float(x) for x in lengths] if policy == "tokens-kk" else costs, k, self.equal_counts)
            method = "kk"
        else:
            matrix = None
            if policy == "ours" and per_rank and cost is None:
                matrix = list(zip(*(m.costs(lengths) for m in plane_cost)))
            inst = B.make_instance([float(x) for x in lengths] if policy == "tokens" else costs, speeds, lengths,
                                   self.token_cap, self.equal_counts, rank_costs=matrix)
            curves = plane_cost if per_rank else [plane_cost]
            seconds = policy == "ours" and cost is None and all(c.unit == "s" for c in curves)
            res = B.balance(inst, backend=self.backend, time_limit_s=self.time_limit_s, work_limit=self.work_limit,
                            gap_tol=self.gap_tol, min_gain=self.min_gain_s if seconds else 0.0)
            owner, method, status, gap, detail = res.owner(), res.method, res.status, res.gap, res.detail
        plan_s = time.perf_counter() - t0
        predicted = self._predicted(lengths, owner, (plane_cost, speeds))
        return StepPlan(-1, [], list(lengths), owner, predicted, method, status, gap, plan_s, detail)

    @staticmethod
    def _predicted(lengths, owner, model) -> list[float]:
        """Σ c(L)/speed (or Σ c_r(L)) per rank under `model`, a (cost model(s), speeds) pair."""
        cost, speeds = model
        per_rank = isinstance(cost, (list, tuple))
        predicted = [0.0] * len(speeds)
        for i, r in enumerate(owner):
            predicted[r] += cost[r](lengths[i]) if per_rank else cost(lengths[i]) / speeds[r]
        return predicted

    # ---- checkpoint -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue the exact sample sequence: small and JSON-safe. With a
        plan prefetched, the state before its draw (the steps handed out, not the prefetched one)."""
        if self._pending is not None:
            return copy.deepcopy(self._pending[0])
        return {
            "version": STATE_VERSION, "step": self.step, "seed": self.seed, "global_batch": self.global_batch,
            "sources": [{"name": s.name, "size": len(s.lengths), "epoch": e, "cursor": c}
                        for s, e, c in zip(self.sources, self.epoch, self.cursor)],
            "deficit": list(self.deficit),
        }

    def load_state_dict(self, state: dict) -> None:
        self._drop_pending()
        if state.get("version") != STATE_VERSION:
            raise SpecError(f"data-plane checkpoint: version {state.get('version')!r}, this build reads {STATE_VERSION}")
        names = [s["name"] for s in state["sources"]]
        if names != [s.name for s in self.sources]:
            raise SpecError(f"data-plane checkpoint: sources {names} differ from data.sources "
                            f"{[s.name for s in self.sources]}; resume with the spec the run started with")
        for s, saved in zip(self.sources, state["sources"]):
            if saved["size"] != len(s.lengths):
                raise SpecError(f"data-plane checkpoint: source {s.name!r} had {saved['size']} samples, now "
                                f"{len(s.lengths)}; the resumed order would differ")
        if state["seed"] != self.seed or state["global_batch"] != self.global_batch:
            raise SpecError("data-plane checkpoint: data.mix_seed or the global batch changed since it was written")
        self.step = int(state["step"])
        self.epoch = [int(s["epoch"]) for s in state["sources"]]
        self.cursor = [int(s["cursor"]) for s in state["sources"]]
        self.deficit = [float(x) for x in state["deficit"]]
        self._perm = [None] * len(self.sources)
