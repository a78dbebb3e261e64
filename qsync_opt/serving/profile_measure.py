"""The serving profiler's measuring process: `python -m qsync_opt.serving.profile_measure DIR` times what
DIR/request.json asks (one decoder layer's prefill and decode, the embedding and head, and whole stage calls
of 1 and 2 layers at each pipeline position, as `lm.Stage` runs inside the pipeline) and writes
DIR/result.json. It runs in a fresh process carrying the group's env (oneDNN reads its ISA cap once); the
planner-side profile (`serving/profile.py`) starts it and caches what it returns.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from qsync_opt.io import atomic_write_text
from qsync_opt.serving.weights import ModelSource, build

FLOOR = int(os.environ.get("QSYNC_OPT_SERVING_PROFILE_FLOOR", 7))
"""Timed calls at least, per entry."""
CAP = int(os.environ.get("QSYNC_OPT_SERVING_PROFILE_CAP", 60))
"""Timed calls at most, per entry."""
STABLE = 0.02
"""Stop once the median of all calls is within this fraction of the median without the last LOOKBACK calls."""
LOOKBACK = 3
BUDGET_MS = float(os.environ.get("QSYNC_OPT_SERVING_PROFILE_BUDGET_MS", 400))
"""Timed milliseconds at most per entry (after FLOOR calls): a slow entry's median settles in few calls."""
IDLE_S = float(os.environ.get("QSYNC_OPT_SERVING_PROFILE_IDLE_MS", 1.0)) / 1e3
"""Idle seconds before each timed call: a pipeline stage waits for its input between calls, and a call after a
wait runs on colder caches than one in a tight loop; the profile times calls as they come in the pipeline."""
PROFILE_LAYERS = 4
"""Layers of the model built to profile: layer 1 alone is a layer entry (neither embeds nor holds the head);
stage entries take 1 or 2 layers from the start (embedding), the middle (from layer 1) or the end (LM head)."""


def stage_range(pos: str, n: int) -> tuple[int, int]:
    """[first, last) layers of the profiled model that a stage entry of `n` layers at `pos` runs."""
    return {"first": (0, n), "mid": (1, 1 + n), "last": (PROFILE_LAYERS - n, PROFILE_LAYERS)}[pos]


def stable_median_ms(fn: Callable[[], object], *, clock: Callable[[], float] = time.perf_counter,
                     floor: int | None = None, cap: int | None = None, budget_ms: float | None = None,
                     idle_s: float = 0.0) -> float:
    """Median ms of calls of `fn` after two warm-up calls: at least `floor` calls, then until the median moves
    by at most STABLE over the last LOOKBACK calls, `cap` calls or `budget_ms` of timed calls; `idle_s` of sleep
    (untimed) before each timed call."""
    floor, cap = floor or FLOOR, cap or CAP
    budget_ms = BUDGET_MS if budget_ms is None else budget_ms
    fn()
    fn()
    times, medians = [], []
    while len(times) < cap:
        if idle_s:
            time.sleep(idle_s)
        t = clock()
        fn()
        times.append((clock() - t) * 1e3)
        med = _median(times)
        medians.append(med)
        if len(times) >= max(floor, LOOKBACK + 1):
            if abs(med - medians[-1 - LOOKBACK]) <= STABLE * med or sum(times) >= budget_ms:
                break
    return _median(times)


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


def measure(req: dict, timer: Callable[[str, Callable[[], object]], float] | None = None) -> dict[str, float]:
    """{entry key: ms} for `req`'s keys, in this process (the subprocess's body; tests call it with a fake
    `timer(key, fn) -> ms`). Every key is timed exactly once."""
    import torch  # import cost: torch and transformers: only the measuring process builds the model

    from qsync_opt.serving import lm  # import cost: torch (the runtime's model)

    timer = timer or (lambda key, fn: stable_median_ms(fn, idle_s=IDLE_S))
    if req["threads"] != "default":
        torch.set_num_threads(int(req["threads"]))
    dev = torch.device(req["device"])
    dtype = getattr(torch, req["dtype"])
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    model = build(ModelSource(req["family"], req["config"], None, 0))
    n = PROFILE_LAYERS
    layers: dict[int, lm.Stage] = {}
    ends: dict[str, lm.Stage] = {}
    stages: dict[tuple[str, int], lm.Stage] = {}

    def stage(pos: str, k: int) -> lm.Stage:  # a whole pipeline stage of k 16-bit layers at position pos
        if (pos, k) not in stages:
            a, b = stage_range(pos, k)
            stages[(pos, k)] = lm.Stage(model, a, b, [16] * k, dtype=dtype, group=req["group_size"]).to(dev)
        return stages[(pos, k)]

    def layer(bits: int) -> lm.Stage:
        if bits not in layers:
            layers[bits] = lm.Stage(model, 1, 2, [bits], dtype=dtype, group=req["group_size"]).to(dev)
        return layers[bits]

    def end(which: str) -> lm.Stage:  # the first stage embeds, the last holds the norm and the LM head
        if which not in ends:
            a = 0 if which == "first" else n - 1
            ends[which] = lm.Stage(model, a, a + 1, [16], dtype=dtype, group=req["group_size"]).to(dev)
        return ends[which]

    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    out = {}
    with torch.inference_mode():
        for key in req["keys"]:
            part, fields = key.split("|", 1)
            f = dict(x.split("=", 1) for x in fields.split("|") if "=" in x)
            m, phase = int(f["m"]), ("prefill" if "|prefill" in key else "decode")
            length = int(f.get("s") or f.get("ctx") or 0)
            if part in ("layer", "stage"):
                st = layer(int(f["bits"])) if part == "layer" else stage(f["pos"], int(f["n"]))
                t = length if phase == "prefill" else 1
                pos = 0 if phase == "prefill" else length
                cache = st.new_cache(m, pos + t, dev)
                if phase == "decode":  # the cache holds `length` past positions
                    for kv in cache.k + cache.v:
                        kv.copy_(torch.randn(kv.shape, generator=gen).to(kv.dtype))
                if st.embed:  # the first stage takes token ids, as in the pipeline
                    x = torch.randint(0, vocab, (m, t), generator=gen).to(dev)
                else:
                    x = torch.randn((m, t, hidden), generator=gen).to(device=dev, dtype=dtype)
                rows = slice(0, m)

                def fn(st=st, x=x, cache=cache, rows=rows, pos=pos):
                    y = st(x, cache, rows, pos)
                    if st.head:  # the last stage picks the greedy token, as in the pipeline
                        y.argmax(-1)
                    sync()
            else:
                first, last = end("first"), end("last")
                t = length if phase == "prefill" else 1
                ids = torch.randint(0, vocab, (m, t), generator=gen).to(dev)
                h = torch.randn((m, 1, hidden), generator=gen).to(device=dev, dtype=dtype)

                def fn(first=first, last=last, ids=ids, h=h):
                    e = first.tok(ids)
                    if getattr(first, "tok_norm", None) is not None:
                        first.tok_norm(e)
                    y = last.norm(h)
                    if getattr(last, "project_out", None) is not None:
                        y = last.project_out(y)
                    last.lm_head(y)
                    sync()
            out[key] = float(timer(key, fn))
    return out


def main(argv: list[str] | None = None) -> int:
    """Subprocess entry: `python -m qsync_opt.serving.profile_measure DIR` reads DIR/request.json, writes DIR/result.json."""
    argv = sys.argv[1:] if argv is None else argv
    d = Path(argv[0])
    res = measure(json.loads((d / "request.json").read_text()))
    atomic_write_text(d / "result.json", json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
