"""A replayed Timeline as a Chrome trace (opens in Perfetto / chrome://tracing) and as a PNG.

One process per group, two lanes each: compute (forward, casts, backward, optimizer, idle)
and communication (the lockstep bucket all-reduces). Times in the trace are microseconds.
"""

from __future__ import annotations

import json
from pathlib import Path

from qsync_opt.io import atomic_write_text
from qsync_opt.predictor.replayer import Timeline

COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "cast": "#C44E52", "optimizer": "#8172B3",
          "allreduce": "#55A868", "idle": "#BBBBBB"}


def _comm_events(tl: Timeline):
    """(lane, phase, label, start ms, duration ms) of the lockstep all-reduces (shared by every group)."""
    return [("comm", "allreduce", f"bucket {k}", s, e - s)
            for k, (s, e) in enumerate(zip(tl.bucket_starts, tl.bucket_ends)) if e > s]


def _lockstep_events(tl: Timeline, name: str):
    """The group's compute events with the optimizer moved after the last all-reduce, as lockstep runs it."""
    t = tl.groups[name]
    last = max(tl.bucket_ends, default=0.0)
    out = []
    for ph, label, s, d in t.events:
        if ph == "optimizer" and last > s:
            out.append(("idle", "waiting for the all-reduce (exposed comm + stragglers)", s, last - s))
            s = last
        out.append((ph, label, s, d))
    return out


def chrome_trace(tl: Timeline) -> dict:
    """The timeline as Chrome trace-event JSON (a dict ready for json.dump)."""
    events = []
    for pid, name in enumerate(tl.groups, start=1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"group {name}"}})
        for tid, lane in ((1, "compute"), (2, "communication")):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}})
        compute = [("compute", *e) for e in _lockstep_events(tl, name) if e[3] > 0]
        comm = _comm_events(tl)
        end = max((s + d for _, _, _, s, d in compute), default=0.0)
        if tl.sync_iteration_ms > end + 1e-12:
            compute.append(("compute", "idle", "waiting for stragglers", end, tl.sync_iteration_ms - end))
        for lane, ph, label, s, d in compute + comm:
            events.append({"ph": "X", "name": label, "cat": ph, "pid": pid, "tid": 1 if lane == "compute" else 2,
                           "ts": round(s * 1e3, 3), "dur": round(d * 1e3, 3)})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"iteration_ms": tl.sync_iteration_ms, "idle_ms": tl.idle_ms}}


def write_chrome_trace(tl: Timeline, path: "str | Path") -> Path:
    return atomic_write_text(path, json.dumps(chrome_trace(tl)))


def write_png(tl: Timeline, path: "str | Path", title: str = "") -> Path:
    """Gantt chart: one compute and one communication lane per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trace = chrome_trace(tl)["traceEvents"]
    names = list(tl.groups)
    fig, ax = plt.subplots(figsize=(11, 1 + 0.9 * len(names)))
    ticks, labels = [], []
    for pid, name in enumerate(names, start=1):
        for tid, lane in ((1, "compute"), (2, "comm")):
            y = (len(names) - pid) * 2 + (2 - tid)
            ticks.append(y + 0.4)
            labels.append(f"{name} {lane}")
            bars = [(e["ts"] / 1e3, e["dur"] / 1e3, e["cat"]) for e in trace
                    if e["ph"] == "X" and e["pid"] == pid and e["tid"] == tid]
            for cat in COLORS:
                sel = [(s, d) for s, d, c in bars if c == cat]
                if sel:
                    ax.broken_barh(sel, (y, 0.8), facecolors=COLORS[cat], edgecolor="none")
    ax.set_yticks(ticks, labels)
    ax.set_xlabel("ms from the start of the iteration")
    ax.axvline(tl.sync_iteration_ms, color="k", lw=0.8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), ncol=len(COLORS), loc="upper center", bbox_to_anchor=(0.5, -0.25), fontsize=8)
    ax.set_title(title or f"lockstep iteration {tl.sync_iteration_ms:.2f} ms")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path
