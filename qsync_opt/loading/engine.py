"""The data plane as trainers use it: `open_engine(data, ...)` gives one object with
next_batch() (the step's plan), read(ids) (the samples), state_dict()/load_state_dict() and
close(), in process (the default) or on Ray (`data.engine: ray`): one loader actor per
source reads and preprocesses its samples, one coordinator actor holds the plane, the only
copy of cursors and mix state. Both give the same sample sequence for the same spec.

With `data.shadow` every source's loader has a standby that takes over when it dies or stalls
past `data.stall_timeout_s` (`loading.shadow`); `takeovers` lists them. With `data.prefetch` the
plane plans step t+1 while step t runs (`DataPlane`, `prefetch`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future

from qsync_opt.data.sources import SourceSpec
from qsync_opt.errors import SpecError
from qsync_opt.loading.cost import CostModel
from qsync_opt.loading.plane import SPEC_POLICY, DataPlane, SourceIndex, StepPlan
from qsync_opt.loading.shadow import (
    LoaderFailed,
    LoaderSupervisor,
    Takeover,
    ThreadLoaders,
)
from qsync_opt.loading.sources import SourceReadError, open_source

RAY_MISSING = ("data.engine: 'ray' needs the ray package, which is not installed here; pip install 'ray>=2.9' "
               "(the ray extra), or set data.engine: inprocess")


def _plane_kwargs(data, global_batch, speeds, cost, backend) -> dict:
    return dict(global_batch=global_batch, speeds=list(speeds), policy=SPEC_POLICY[data.balance_policy], cost=cost,
                token_cap=data.token_cap, equal_counts=data.equal_counts, seed=data.mix_seed, backend=backend,
                time_limit_s=data.plan_time_limit_ms / 1000.0, work_limit=data.plan_work_limit,
                min_gain_s=data.plan_min_gain_ms / 1000.0, prefetch=data.prefetch)


def _supervised(data) -> bool:
    """Whether reads go through a `LoaderSupervisor` (a standby, or a deadline)."""
    return bool(data.shadow) or data.stall_timeout_s is not None


def _open_like(spec: SourceSpec, index: int, base_dir, lengths):
    """Source `index` opened again (a standby), checked to hold the samples the plane's index has."""
    src = open_source(spec, index, base_dir)
    if len(src.lengths) != len(lengths) or not (src.lengths == lengths).all():
        raise SpecError(f"data.sources.{index}: opened again for a standby loader it gave other lengths; a source "
                        "must give the same samples every time it is opened")
    return src


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
        self.supervisor = None
        if _supervised(data):
            loaders = ThreadLoaders(lambda i: _open_like(data.sources[i], i, base_dir, self.sources[i].lengths))
            self.supervisor = LoaderSupervisor(loaders, self.sources, [s.name for s in data.sources],
                                               shadow=data.shadow, stall_timeout_s=data.stall_timeout_s,
                                               full_every=data.checkpoint_full_every)

    @property
    def takeovers(self) -> list[Takeover]:
        """Every standby that took over a loader, in order (empty without `data.shadow`)."""
        return list(self.supervisor.takeovers) if self.supervisor is not None else []

    def next_batch(self) -> StepPlan:
        if self.supervisor is None:
            return self.plane.next_batch()
        state = self.plane.state_dict()  # the state this step is drawn from (with a prefetch: before its draw)
        plan = self.plane.next_batch()
        self.supervisor.handed_out(plan.step, state, plan.samples)
        return plan

    def read(self, ids: Sequence[tuple[int, int]], step: int | None = None) -> list:
        """The samples of `ids` in order; `step`, the step they were handed out in, places a standby's takeover
        (default: found from the ids)."""
        if self.supervisor is not None:
            return self.supervisor.read(ids, step)
        return _gather(ids, lambda s, idx: [self.sources[s].get(i) for i in idx])

    def state_dict(self) -> dict:
        return self.plane.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.plane.load_state_dict(state)
        if self.supervisor is not None:
            self.supervisor.forget_steps()

    def close(self) -> None:
        self.plane.close()
        if self.supervisor is not None:
            self.supervisor.close()


class _Loader:
    """Ray actor: one source, read (and preprocessed) where it runs."""

    def __init__(self, spec: dict, index: int, base_dir):
        import torch  # noqa: F401  (a source's samples are tensors: torch is imported as the loader starts, not
        # inside its first read, which the supervisor times against data.stall_timeout_s)

        self.source = open_source(SourceSpec.model_validate(spec), index, base_dir)

    def lengths(self):
        return self.source.lengths

    def pid(self) -> int:
        """The process this loader runs in (what a kill -9 stops)."""
        return os.getpid()

    def read(self, indices):
        return [self.source.get(i) for i in indices]


class _Coordinator:
    """Ray actor: the data plane."""

    def __init__(self, index, kwargs):
        self.plane = DataPlane(index, **kwargs)

    def next_batch(self):
        state = self.plane.state_dict()
        return self.plane.next_batch(), state

    def close(self):
        self.plane.close()

    def state_dict(self):
        return self.plane.state_dict()

    def load_state_dict(self, state):
        self.plane.load_state_dict(state)


class RayLoaders:
    """Loader actors for `LoaderSupervisor`: spawn (an actor, ready once its lengths match the index), read,
    kill (`ray.kill`)."""

    def __init__(self, ray, data, base_dir, loader_cpus: float, lengths: Sequence | None = None):
        self.ray, self.data, self.base_dir, self.cpus = ray, data, base_dir, loader_cpus
        self.Loader = ray.remote(_Loader)
        self.lengths = lengths

    def start(self, s: int):
        return self.Loader.options(num_cpus=self.cpus).remote(self.data.sources[s].model_dump(by_alias=True), s,
                                                              self.base_dir)

    def spawn(self, s: int) -> Future:
        fut: Future = Future()

        def ready():
            try:
                actor = self.start(s)
                got = self.ray.get(actor.lengths.remote())
                if len(got) != len(self.lengths[s]) or not (got == self.lengths[s]).all():
                    self.ray.kill(actor)
                    raise SpecError(f"data.sources.{s}: opened again for a standby loader it gave other lengths; "
                                    "a source must give the same samples every time it is opened")
                fut.set_result(actor)
            except BaseException as e:  # noqa: BLE001  (handed to the takeover that needs it)
                fut.set_exception(e)

        threading.Thread(target=ready, daemon=True, name=f"loader-standby-{s}").start()
        return fut

    def submit(self, actor, indices):
        return actor.read.remote(list(indices))

    def result(self, ref, timeout: float | None) -> list:
        ex = self.ray.exceptions
        try:
            return self.ray.get(ref, timeout=timeout)
        except ex.GetTimeoutError:
            with contextlib.suppress(Exception):  # best effort: the stalled loader is killed when its standby takes over
                self.ray.cancel(ref)
            raise LoaderFailed(f"stalled: no answer within {timeout:.3g} s", stalled=True) from None
        except ex.RayTaskError as e:  # the read raised inside the actor
            cause = getattr(e, "cause", None) or e
            text = str(cause).splitlines()[-1] if str(cause) else type(cause).__name__
            raise LoaderFailed(f"died: {text}", error=cause if isinstance(cause, SourceReadError) else None) from None
        except (ex.RayActorError, getattr(ex, "ActorUnavailableError", ex.RayActorError)) as e:
            raise LoaderFailed(f"died: its Ray actor is gone ({type(e).__name__})") from None

    def kill(self, actor) -> None:
        with contextlib.suppress(Exception):  # already gone
            self.ray.kill(actor)


class RayEngine:
    def __init__(self, data, *, global_batch: int, speeds: Sequence[float], cost: CostModel | None = None,
                 base_dir=None, backend: str | None = "cpsat", loader_cpus: float = 0.5):
        try:
            import ray  # import cost: ray, only with data.engine: ray
        except ImportError:
            raise SpecError(RAY_MISSING) from None
        self._ray = ray
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        self.names = [s.name for s in data.sources]
        actors = RayLoaders(ray, data, base_dir, loader_cpus)
        self.loaders = [actors.start(i) for i in range(len(data.sources))]
        lengths = self._get([ld.lengths.remote() for ld in self.loaders])
        actors.lengths = lengths
        index = [_index(s, L) for s, L in zip(data.sources, lengths)]
        self.coordinator = ray.remote(_Coordinator).options(num_cpus=0).remote(
            index, _plane_kwargs(data, global_batch, speeds, cost, backend))
        self.supervisor = LoaderSupervisor(actors, self.loaders, self.names, shadow=data.shadow,
                                           stall_timeout_s=data.stall_timeout_s, full_every=data.checkpoint_full_every)

    def _get(self, refs):
        try:
            return self._ray.get(refs)
        except Exception as e:
            cause = getattr(e, "cause", None) or e
            if isinstance(cause, (SourceReadError, SpecError)):
                raise type(cause)(str(cause).splitlines()[-1] if isinstance(cause, SourceReadError) else str(cause)) from None
            raise

    @property
    def takeovers(self) -> list[Takeover]:
        """Every standby that took over a loader, in order (empty without `data.shadow`)."""
        return list(self.supervisor.takeovers)

    def loader(self, s: int):
        """Source s's loader actor now (after a takeover, the standby that took over)."""
        return self.supervisor.primary[s]

    def next_batch(self) -> StepPlan:
        plan, state = self._get(self.coordinator.next_batch.remote())
        self.supervisor.handed_out(plan.step, state, plan.samples)
        return plan

    def read(self, ids: Sequence[tuple[int, int]], step: int | None = None) -> list:
        """As `LocalEngine.read`; the loader actors of different sources read in parallel."""
        return self.supervisor.read(ids, step)

    def state_dict(self) -> dict:
        return self._get(self.coordinator.state_dict.remote())

    def load_state_dict(self, state: dict) -> None:
        self._get(self.coordinator.load_state_dict.remote(state))
        self.supervisor.forget_steps()

    def close(self) -> None:
        self.supervisor.close()
        self._ray.kill(self.coordinator)


def open_engine(data, **kw):
    """LocalEngine or RayEngine as `data.engine` says."""
    if not data.sources:
        raise SpecError("data.sources: the data plane needs sources; list them under data.sources")
    if data.engine == "ray":
        return RayEngine(data, **kw)
    kw.pop("loader_cpus", None)
    return LocalEngine(data, **kw)
