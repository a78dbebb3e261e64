"""Graph capture under threads: one capture at a time, other threads' modules unharmed."""

from __future__ import annotations

import threading

import torch
from torch import nn

from qsync_opt.models.tracing import symbolic_trace, trace

ORIGINAL_CALL = nn.Module.__call__


class _Paused(nn.Module):
    """Its forward, run by the tracer with proxies, waits until the test lets it go on."""

    def __init__(self, inside: threading.Event, proceed: threading.Event):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.inside, self.proceed = inside, proceed

    def forward(self, x):
        self.inside.set()
        assert self.proceed.wait(60), "the test never let the trace go on"
        return self.lin(x)


def test_modules_run_on_other_threads_while_a_trace_holds_torch_patched():
    inside, proceed = threading.Event(), threading.Event()
    out: dict = {}

    def tracing():
        try:
            out["graph"] = symbolic_trace(_Paused(inside, proceed))
        except Exception as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=tracing)
    t.start()
    try:
        assert inside.wait(60)
        assert nn.Module.__call__ is not ORIGINAL_CALL  # fx has patched torch for everyone right now
        lin = nn.Linear(4, 2)
        y = lin(torch.ones(1, 4))  # without confinement: NameError "module is not installed as a submodule"
        assert torch.allclose(y, torch.ones(1, 4) @ lin.weight.T + lin.bias)
        # a whole trace of another model, on a third thread, waits for the lock and then works:
        started = threading.Event()
        other: dict = {}

        def second():
            started.set()
            other["graph"] = trace(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), torch.ones(1, 4))

        t2 = threading.Thread(target=second)
        t2.start()
        assert started.wait(60)
    finally:
        proceed.set()
        t.join(60)
    t2.join(60)
    assert "error" not in out, out.get("error")
    assert [n.name for n in other["graph"].nodes] == ["0", "1"]
    assert nn.Module.__call__ is ORIGINAL_CALL  # every patch reverted: a later serial trace works
    assert [n.name for n in trace(nn.Sequential(nn.Linear(4, 3)), torch.ones(1, 4)).nodes] == ["0"]
