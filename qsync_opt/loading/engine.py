"""The data plane as trainers use it: `open_engine(data, ...)` gives one object with
next_batch() (the step's plan), read(ids) (the samples), state_dict()/load_state_dict() and
close(), in process (the default) or on Ray (`data.engine: ray`): one loader actor per
source reads and preprocesses its samples, one coordinator actor holds the plane, the only
copy of cursors and mix state. Both give the same sample sequence for the same spec.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from qsync_opt.data.sources import SourceSpec
from qsync_opt.errors import SpecError
from qsync_opt.loading.cost import CostModel
from qsync_opt.loading.plane import SPEC_POLICY, DataPlane, SourceIndex, StepPlan
from qsync_opt.loading.sources import SourceReadError, open_source

RAY_MISSING = ("data.engine: 'ray' needs the ray package, which is not installed here; pip install 'ray>=2.9' "
               "(the ray extra), or set data.engine: inprocess")


def _plane_kwargs(data, global_batch, speeds, cost, backend) -> dict:
    return dict(global_batch=global_batch, speeds=list(speeds), policy=SPEC_POLICY[data.balance_policy], cost=cost,
                token_cap=data.token_cap, equal_counts=data.equal_counts, seed=data.mix_seed, backend=backend,
                time_limit_s=data.plan_time_limit_ms / 1000.0, work_limit=data.plan_work_limit,
                min_gain_s=data.plan_min_gain_ms / 1000.0)


def _index(spec: SourceSpec, lengths) -> SourceIndex:
    sched = spec.schedule or [(0, spec.weight_at(0))]
    return SourceIndex(spec.name, lengths, tuple((int(a), float(b)) for a, b in sched))


def _gather(ids: Sequence[tuple[int, int]], read_many) -> list:
    by_source: dict[int, list[int]] = defaultdict(list)
    for s, i in ids:
        by_source[s].append(i)
    got = {s: iter(read_many(s, idx)) for s, idx in by_source.items()}
    return [next(got[s]) for s, _ in ids]


class LocalEngine:
    def __init__(self, data, *, global_batch: int, speeds: Sequence[float], cost: CostModel | None = None,
                 base_dir=None, backend: str | None = "cpsat"):
        self.sources = [open_source(s, i, base_dir) for i, s in enumerate(data.sources)]
        index = [_index(s, o.lengths) for s, o in zip(data.sources, self.sources)]
        self.plane = DataPlane(index, **_plane_kwargs(data, global_batch, speeds, cost, backend))

    def next_batch(self) -> StepPlan:
        return self.plane.next_batch()

    def read(self, ids: Sequence[tuple[int, int]]) -> list:
        return _gather(ids, lambda s, idx: [self.sources[s].get(i) for i in idx])

    def state_dict(self) -> dict:
        return self.plane.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.plane.load_state_dict(state)

    def close(self) -> None:
        pass


class _Loader:
    """Ray actor: one source, read (and preprocessed) where it runs."""

    def __init__(self, spec: dict, index: int, base_dir):
        self.source = open_source(SourceSpec.model_validate(spec), index, base_dir)

    def lengths(self):
        return self.source.lengths

    def read(self, indices):
        return [self.source.get(i) for i in indices]


class _Coordinator:
    """Ray actor: the data plane."""

    def __init__(self, index, kwargs):
        self.plane = DataPlane(index, **kwargs)

    def next_batch(self):
        return self.plane.next_batch()

    def state_dict(self):
        return self.plane.state_dict()

    def load_state_dict(self, state):
        self.plane.load_state_dict(state)


class RayEngine:
    def __init__(self, data, *, global_batch: int, speeds: Sequence[float], cost: CostModel | None = None,
                 base_dir=None, backend: str | None = "cpsat", loader_cpus: float = 0.5):
        try:
            import ray
        except ImportError:
            raise SpecError(RAY_MISSING) from None
        self._ray = ray
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        self.names = [s.name for s in data.sources]
        Loader = ray.remote(_Loader)
        self.loaders = [Loader.options(num_cpus=loader_cpus).remote(s.model_dump(by_alias=True), i, base_dir)
                        for i, s in enumerate(data.sources)]
        lengths = self._get([ld.lengths.remote() for ld in self.loaders])
        index = [_index(s, L) for s, L in zip(data.sources, lengths)]
        self.coordinator = ray.remote(_Coordinator).options(num_cpus=0).remote(
            index, _plane_kwargs(data, global_batch, speeds, cost, backend))

    def _get(self, refs):
        try:
            return self._ray.get(refs)
        except Exception as e:
            cause = getattr(e, "cause", None) or e
            if isinstance(cause, (SourceReadError, SpecError)):
                raise type(cause)(str(cause).splitlines()[-1] if isinstance(cause, SourceReadError) else str(cause)) from None
            raise

    def next_batch(self) -> StepPlan:
        return self._get(self.coordinator.next_batch.remote())

    def read(self, ids: Sequence[tuple[int, int]]) -> list:
        return _gather(ids, lambda s, idx: self._get(self.loaders[s].read.remote(list(idx))))

    def state_dict(self) -> dict:
        return self._get(self.coordinator.state_dict.remote())

    def load_state_dict(self, state: dict) -> None:
        self._get(self.coordinator.load_state_dict.remote(state))

    def close(self) -> None:
        for a in [*self.loaders, self.coordinator]:
            self._ray.kill(a)


def open_engine(data, **kw):
    """LocalEngine or RayEngine as `data.engine` says."""
    if not data.sources:
        raise SpecError("data.sources: the data plane needs sources; list them under data.sources")
    if data.engine == "ray":
        return RayEngine(data, **kw)
    kw.pop("loader_cpus", None)
    return LocalEngine(data, **kw)
