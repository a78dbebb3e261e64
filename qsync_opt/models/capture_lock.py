"""Graph capture, one at a time per process, without breaking other threads' modules.

torch.fx's symbolic tracing patches torch for its whole duration, process-wide:
`nn.Module.__call__` and `nn.Module.__getattr__` become closures over the running
Tracer, wrapped functions and `math` are swapped, and the patcher is one module global
(`torch.fx._symbolic_trace.CURRENT_PATCHER`). Two traces at once interleave their
save/restore of those patches (one can restore the other's wrapper, leaving
`Module.__call__` patched for good), and any module called in *another* thread while a
trace runs goes through the tracer's `call_module`, which fails with "module is not
installed as a submodule". torch.export holds process-wide state of its own (dynamo's
caches and config, fake-tensor modes), so it takes the same lock.

`capturing(tracer)` is the narrowest fix: one re-entrant lock held only while a capture
runs (not while shapes are recorded, indicators computed or programs solved), and, for an
fx tracer, per-instance `call_module` / `getattr` that trace only on the thread that owns
the trace and plainly run the module (or return the attribute) on any other thread. So
other threads keep running modules, and solving, during a capture.

What it cannot cover: a capture started outside qsync_opt (user code calling
`torch.fx.symbolic_trace` itself in another thread) does not take this lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.RLock()
"""Held for the duration of one capture (re-entrant: a capture may nest in the same thread)."""


@contextmanager
def capturing(tracer=None) -> Iterator[None]:
    """Hold the process's capture lock; an fx `tracer` only traces calls from this thread."""
    with _LOCK:
        if tracer is not None:
            _confine_to_thread(tracer, threading.get_ident())
        yield


def _confine_to_thread(tracer, owner: int) -> None:
    """Instance-level overrides: fx's patched `Module.__call__` / `__getattr__` look these up on
    the tracer, so calls from threads other than `owner` bypass the trace. Left in place after
    the capture (a thread may still be inside a patched call when the patches are reverted)."""
    call_module, getattr_ = tracer.call_module, tracer.getattr

    def confined_call_module(m, forward, args, kwargs):
        if threading.get_ident() != owner:
            return forward(*args, **kwargs)  # fx's `forward` is the original Module.__call__
        return call_module(m, forward, args, kwargs)

    def confined_getattr(attr, attr_val, parameter_proxy_cache):
        if threading.get_ident() != owner:
            return attr_val
        return getattr_(attr, attr_val, parameter_proxy_cache)

    tracer.call_module = confined_call_module
    tracer.getattr = confined_getattr
