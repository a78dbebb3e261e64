"""Shadow loaders (Omniload's standby loaders): every source's loader can have a standby, opened
beside it, that takes over when the loader dies or stalls, so the consumer's reads go on.

A loader reads its source's samples by index (a thread in process, an actor on Ray); it holds no
cursor: the data plane (the coordinator) owns every source's (epoch, cursor), and the engine
records the plane's state at every step it hands out with the training checkpoint's differential
format (`loading.checkpoint.DiffCheckpointer`: a full state every `full_every` steps, only the
changes in between). A read goes to the source's loader with a deadline (`stall_timeout_s`);
when the loader raises, its Ray actor is gone, or the deadline passes, the supervisor:

1. restores the state the step was drawn from out of its record (the full state, checksum
   checked, plus the delta), and from the source's (epoch, cursor) in it recomputes the samples
   that source gives in that step (`plane.source_stream`); a request that is not among them is
   an error (the record and the plan disagree), never a silent read;
2. promotes the standby (the old loader is killed, or abandoned if it is a stuck thread), sends
   it the whole request again, and opens a new standby in the background;
3. records a `Takeover` (step, source, reason, seconds from the failure's detection to the
   standby's samples in hand).

A request's samples are taken from one loader's complete answer only, in the order asked, so a
takeover neither loses nor repeats a sample. A request the standby also fails is the source's
fault, not the loader's (a sample that cannot be read): `SourceReadError` naming the source, as
without a standby. Without a standby (`shadow: false`) the first failure is that error.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from qsync_opt.loading.checkpoint import DiffCheckpointer, resolve
from qsync_opt.loading.plane import source_stream
from qsync_opt.loading.sources import SourceReadError

RETAIN_STEPS = 16
"""Handed-out steps whose plan and state record the supervisor keeps (a consumer reads a step at most
this many steps after the plane handed it out)."""


class LoaderFailed(Exception):
    """A loader did not deliver: `reason` says how (it raised, its actor died, it stalled)."""

    def __init__(self, reason: str, stalled: bool = False, error: Exception | None = None):
        super().__init__(reason)
        self.reason, self.stalled, self.error = reason, stalled, error
        """`error`: the source's own error when the read raised one (SourceReadError names the sample)."""


@dataclass(frozen=True)
class Takeover:
    """One standby taking over a source's loader."""

    step: int | None
    """The step whose samples were being read (None: a read of ids from no step handed out)."""
    source: str
    reason: str
    """'died: ...' (it raised, or its actor was killed) or 'stalled: ...' (no answer within the deadline)."""
    seconds: float
    """From the failure's detection to the standby's samples in hand (a stall's deadline comes before it)."""
    resumed_from: int | None
    """Step of the full state the standby's position was restored from (plus that step's delta)."""

    def cell(self) -> str:
        """Compact text for a CSV cell: source:reason-kind:seconds."""
        return f"{self.source}:{self.reason.split(':', 1)[0]}:{self.seconds:.3g}s"


class ThreadLoaders:
    """In-process loaders: each read runs on its own daemon thread, so a stuck read can be timed out
    and abandoned (it never blocks the interpreter's exit)."""

    def __init__(self, open_source: Callable[[int], object]):
        import torch  # noqa: F401  (samples are tensors: imported here, not inside the first timed read)

        self.open_source = open_source

    def spawn(self, s: int) -> Future:
        fut: Future = Future()
        threading.Thread(target=_run_into, args=(fut, self.open_source, s), daemon=True,
                         name=f"loader-open-{s}").start()
        return fut

    def submit(self, handle, indices: Sequence[int]) -> Future:
        fut: Future = Future()
        threading.Thread(target=_run_into, args=(fut, lambda idx: [handle.get(i) for i in idx], list(indices)),
                         daemon=True, name=f"loader-read-{getattr(handle, 'name', '?')}").start()
        return fut

    @staticmethod
    def result(pending: Future, timeout: float | None) -> list:
        try:
            return pending.result(timeout=timeout)
        except FutureTimeout:
            raise LoaderFailed(f"stalled: no answer within {timeout:.3g} s", stalled=True) from None
        except Exception as e:  # noqa: BLE001  (any exception of a read: the loader is taken as dead)
            raise LoaderFailed(f"died: {str(e).splitlines()[0] if str(e) else type(e).__name__}", error=e) from None

    def kill(self, handle) -> None:
        """A thread cannot be stopped: a stuck read is abandoned and its answer, if one comes, dropped."""


def _run_into(fut: Future, fn, arg) -> None:
    try:
        fut.set_result(fn(arg))
    except BaseException as e:  # noqa: BLE001  (handed to the waiting reader)
        fut.set_exception(e)


class LoaderSupervisor:
    """Reads of every source through its loader, with a standby per source (`shadow`) and a deadline
    per read (`stall_timeout_s`). `backend` makes, reads through and kills loaders (`ThreadLoaders`,
    or the Ray engine's actors); `first` are the loaders already open, one per source."""

    def __init__(self, backend, first: Sequence, names: Sequence[str], *, shadow: bool,
                 stall_timeout_s: float | None, full_every: int = 8):
        self.backend, self.names = backend, list(names)
        self.shadow, self.stall_timeout_s = bool(shadow), stall_timeout_s
        self.primary = list(first)
        self.generation = [0] * len(self.primary)
        self.standby: list[Future | None] = [backend.spawn(s) if shadow else None for s in range(len(self.primary))]
        self.locks = [threading.Lock() for _ in self.primary]
        self.takeovers: list[Takeover] = []
        self._store = tempfile.mkdtemp(prefix="qsync-plane-journal-") if shadow else None
        self._journal = DiffCheckpointer(self._store, full_every=full_every, keep=RETAIN_STEPS) if shadow else None
        self._steps: OrderedDict[int, tuple[dict, list[tuple[int, int]]]] = OrderedDict()
        self._steps_lock = threading.Lock()

    # ---- the plane's state, per step handed out -------------------------------------------
    def handed_out(self, step: int, state_before: dict, samples: Sequence[tuple[int, int]]) -> None:
        """Record step `step`: the plane's state it was drawn from (as a full-or-delta record) and its samples."""
        if self._journal is None:
            return
        record = self._journal.record(step, state_before)
        with self._steps_lock:
            self._steps[int(step)] = (record, [(int(s), int(i)) for s, i in samples])
            while len(self._steps) > RETAIN_STEPS:
                self._steps.popitem(last=False)
        self._journal.prune()

    def forget_steps(self) -> None:
        """Drop the recorded steps (the plane was moved to another state: a resume)."""
        with self._steps_lock:
            self._steps.clear()

    def _step_of(self, ids: Sequence[tuple[int, int]]) -> int | None:
        """The oldest retained step whose samples hold every one of `ids`."""
        want = Counter((int(s), int(i)) for s, i in ids)
        with self._steps_lock:
            for step, (_, samples) in self._steps.items():
                have = Counter(samples)
                if all(have[k] >= n for k, n in want.items()):
                    return step
        return None

    def _position(self, step: int | None, s: int, indices: Sequence[int]) -> int | None:
        """Check `indices` against what source `s` gives in `step` by the state recorded for it; the step of
        the full state that record rests on (None when the step is not retained)."""
        with self._steps_lock:
            got = self._steps.get(step) if step is not None else None
        if got is None:
            return None
        record, samples = got
        state = resolve(self._store, record)
        src = state["sources"][s]
        n = sum(1 for x, _ in samples if x == s)
        drawn = Counter(source_stream(int(state["seed"]), s, int(src["size"]), int(src["epoch"]), int(src["cursor"]), n))
        asked = Counter(int(i) for i in indices)
        if any(drawn[i] < k for i, k in asked.items()):
            raise SourceReadError(f"data source {self.names[s]!r}: the standby was asked for samples the plane's "
                                  f"recorded state at step {step} does not draw from it; the engine's plan and its "
                                  "state record disagree")
        return int(record["base_step"])

    # ---- reads ------------------------------------------------------------------------------
    def read(self, ids: Sequence[tuple[int, int]], step: int | None = None) -> list:
        """The samples of `ids`, in order; `step` is the step they were handed out in (default: found from the ids)."""
        by_source: dict[int, list[int]] = {}
        for s, i in ids:
            by_source.setdefault(int(s), []).append(int(i))
        sent = {s: self._submit(s, idx) for s, idx in by_source.items()}
        got = {}
        for s, idx in by_source.items():
            got[s] = iter(self._collect(s, idx, sent[s], step))
        return [next(got[int(s)]) for s, _ in ids]

    def _submit(self, s: int, idx: list[int]):
        gen, handle = self.generation[s], self.primary[s]
        return gen, time.perf_counter(), self.backend.submit(handle, idx)

    def _wait(self, pending, t_sent: float):
        if self.stall_timeout_s is None:
            return self.backend.result(pending, None)
        try:
            return self.backend.result(pending, max(0.0, t_sent + self.stall_timeout_s - time.perf_counter()))
        except LoaderFailed as e:
            if e.stalled:  # the deadline as set, not what was left of it at this wait
                raise LoaderFailed(f"stalled: no answer within {self.stall_timeout_s:g} s (data.stall_timeout_s)",
                                   stalled=True) from None
            raise

    def _collect(self, s: int, idx: list[int], sent, step) -> list:
        gen, t_sent, pending = sent
        failed: LoaderFailed | None = None  # this request's first failure
        for _ in range(3):  # the loader; a standby another reader promoted; a standby this reader promotes
            try:
                return self._wait(pending, t_sent)
            except LoaderFailed as e:
                t_fail = time.perf_counter()
                if not self.shadow:
                    raise self._no_standby(s, e, step) from None
                with self.locks[s]:
                    mine = self.generation[s] == gen  # the first reader to see this loader fail takes over
                    if mine:
                        if step is None:
                            step = self._step_of([(s, i) for i in idx])
                        resumed = self._position(step, s, idx)
                        self._promote(s)
                    gen, handle = self.generation[s], self.primary[s]
                failed = failed or e
                t_sent, pending = time.perf_counter(), self.backend.submit(handle, idx)
                if mine:
                    try:
                        out = self._wait(pending, t_sent)
                    except LoaderFailed as e2:
                        raise self._both_failed(s, e, e2, step) from None
                    self.takeovers.append(Takeover(step, self.names[s], e.reason, time.perf_counter() - t_fail,
                                                   resumed))
                    return out
        raise self._both_failed(s, failed, failed, step)

    def _promote(self, s: int) -> None:
        """The standby becomes source s's loader (the old one killed); a new standby opens in the background."""
        old = self.primary[s]
        try:
            self.primary[s] = self.standby[s].result()
        except Exception as e:  # noqa: BLE001
            raise SourceReadError(f"data source {self.names[s]!r}: its loader failed and its standby could not be "
                                  f"opened ({type(e).__name__}: {e})") from None
        self.generation[s] += 1
        self.standby[s] = self.backend.spawn(s)
        self.backend.kill(old)

    def _no_standby(self, s: int, e: LoaderFailed, step) -> SourceReadError:
        if isinstance(e.error, SourceReadError):  # the source raised: its own error names the sample
            return SourceReadError(str(e.error).splitlines()[-1])
        at = f" at step {step}" if step is not None else ""
        return SourceReadError(f"data source {self.names[s]!r}: its loader {e.reason}{at}, and it has no standby; "
                               "set data.shadow: true (loading spec: shadow: true) for one that takes over")

    def _both_failed(self, s: int, first: LoaderFailed, then: LoaderFailed, step) -> SourceReadError:
        at = f" at step {step}" if step is not None else ""
        return SourceReadError(f"data source {self.names[s]!r}: its loader {first.reason}{at}, and its standby "
                               f"{then.reason} on the same samples: the source itself fails there; check it")

    def close(self) -> None:
        for s, h in enumerate(self.primary):
            self.backend.kill(h)
            fut = self.standby[s]
            if fut is not None:
                fut.add_done_callback(lambda f: self.backend.kill(f.result()) if f.exception() is None else None)
        if self._store is not None:
            shutil.rmtree(self._store, ignore_errors=True)
