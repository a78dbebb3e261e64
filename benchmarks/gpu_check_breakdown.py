"""Where a runtime module's forward + backward time goes: gpu_check's `breakdown` step.

The runtime names each of its steps as a profiler range (runtime.casts.scope: `qsync::quantize[fp8_e4m3]`,
`qsync::gemm[int8]`, `qsync::cast[fp32->bf16]`, `qsync::backward[fp8_e4m3@fp8]`, ...). torch.profiler over a few
forward + backward steps of the `ratios` linear gives each range's own time (its time less that of the ranges
inside it) and the busiest kernels: device time on a GPU (each kernel counted in the innermost range whose op
launched it), CPU time on a CPU. What is left outside every range is the autograd and module glue (and on a GPU
the kernels of ops outside them, such as the bias gradient's sum).
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

import gpu_check_parts as parts

#: (precision, backward) of the configurations split: bf16 as the baseline, fp8_e4m3 with either backward, int8.
CONFIGS = (("bf16", None), ("fp8_e4m3", None), ("fp8_e4m3", "fp8"), ("int8", None))
#: Kernels (GPU) or ops (CPU) listed per configuration, busiest first.
TOP = 6
PREFIX = "qsync::"


def _own_kernels_us(e) -> float:
    """Device time of the kernels op `e` itself launched. A range's GPU-side annotation, which kineto may link to it
    like a kernel (named as the range), is not a kernel: counting it would count the range's kernels twice."""
    return sum(k.duration for k in e.kernels if not k.name.startswith(PREFIX))


def _time(e, gpu: bool, own: bool) -> float:
    """An event's time in us: device time of the kernels it (own: it alone; else with its children's) launched on a
    GPU, CPU time on a CPU."""
    if gpu:
        return _own_kernels_us(e) + (0.0 if own else sum(_time(c, gpu, own=False) for c in e.cpu_children))
    return e.self_cpu_time_total if own else e.cpu_time_total


def _inner_ranges(e):
    """The qsync ranges directly inside event `e` (the first met on each path down its children)."""
    for c in e.cpu_children:
        if c.name.startswith(PREFIX):
            yield c
        else:
            yield from _inner_ranges(c)


def attribute(events, steps: int, gpu: bool) -> list[dict]:
    """Rows {kind: 'range' | 'outside' | 'kernel' | 'op' | 'total', name, ms (per step), share (of the total)} from
    a profile's `events` over `steps` steps. Range rows and the 'outside' row sum to the total."""
    cpu_events = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    total = sum(_time(e, gpu, own=True) for e in cpu_events)  # every kernel (or CPU us) counted once, by its op
    ranges: dict[str, float] = {}
    for e in cpu_events:
        if e.name.startswith(PREFIX):
            own = _time(e, gpu, own=False) - sum(_time(c, gpu, own=False) for c in _inner_ranges(e))
            ranges[e.name[len(PREFIX):]] = ranges.get(e.name[len(PREFIX):], 0.0) + own
    outside = total - sum(ranges.values())
    busiest: dict[str, float] = {}
    if gpu:
        for e in events:
            if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation \
                    and not e.name.startswith(PREFIX):
                busiest[e.name] = busiest.get(e.name, 0.0) + e.time_range.elapsed_us()
    else:
        for e in cpu_events:
            if not e.name.startswith(PREFIX):
                busiest[e.name] = busiest.get(e.name, 0.0) + e.self_cpu_time_total
    row = lambda kind, name, us: {"kind": kind, "name": name, "ms": us / 1e3 / steps,  # noqa: E731
                                  "share": us / total if total > 0 else 0.0}
    rows = [row("total", "all", total)]
    rows += [row("range", n, us) for n, us in sorted(ranges.items(), key=lambda kv: -kv[1])]
    rows.append(row("outside", "outside every qsync range", outside))
    top = sorted(busiest.items(), key=lambda kv: -kv[1])[:TOP]
    rows += [row("kernel" if gpu else "op", n[:120], us) for n, us in top]
    return rows


def breakdown(device: torch.device, big: bool, steps: int = 3) -> list[dict]:
    """The `ratios` linear at each of CONFIGS: after two warm-up steps, `steps` forward + backward steps under
    torch.profiler, split by `attribute`. Rows carry `config` ('<precision>, backward <b>')."""
    label, base, shape = parts.shapes(big)[0]
    gpu = device.type == "cuda"
    x = torch.randn(shape, device=device)
    rows = []
    for precision, backward in CONFIGS:
        m = parts.quantized(base, precision, device, backward=backward)
        bwd = backward or ("-" if precision == "bf16" else parts.backward_precision(device))
        config = f"{precision}, backward {bwd}"
        xg = x.clone().requires_grad_(True)
        gy = torch.ones(shape[0], base.out_features, device=device)

        def step():
            m(xg).backward(gy)

        for _ in range(2):
            step()
        parts.sync(device)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        with profile(activities=acts) as prof:
            for _ in range(steps):
                step()
            parts.sync(device)
        rows += [{"shape": label, "config": config, **r} for r in attribute(prof.events(), steps, gpu)]
    return rows


def problems(rows: list[dict]) -> list[str]:
    """Why the step's rows are wrong: each configuration needs a positive total, finite non-negative range times
    (a negative one would mean a range's inner ranges were counted twice) and its GEMM's range."""
    out = []
    for precision, backward in CONFIGS:
        mine = [r for r in rows if r["config"].startswith(f"{precision}, backward {backward or ''}")]
        total = next((r["ms"] for r in mine if r["kind"] == "total"), None)
        if not total or not total > 0:
            out.append(f"{precision} backward {backward}: no time measured")
            continue
        bad = [r["name"] for r in mine if r["kind"] in ("range", "kernel", "op") and not r["ms"] >= -1e-6 * total]
        if bad:
            out.append(f"{precision} backward {backward}: negative or non-finite time in {bad}")
        if precision != "bf16" and not any(r["kind"] == "range" and r["name"] == f"gemm[{precision}]" for r in mine):
            out.append(f"{precision} backward {backward}: no gemm[{precision}] range (the runtime's scopes changed?)")
    return out


def table(rows: list[dict]) -> list[str]:
    """Markdown lines: per configuration, its total and each range's ms and share."""
    lines = ["| config | total ms | ranges: ms (share) | busiest kernels / ops: ms |", "|---|---|---|---|"]
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == config]
        total = next(r["ms"] for r in mine if r["kind"] == "total")
        ranges = ", ".join(f"{r['name']} {r['ms']:.3f} ({r['share']:.0%})" for r in mine
                           if r["kind"] in ("range", "outside"))
        busy = ", ".join(f"{r['name'][:40]} {r['ms']:.3f}" for r in mine if r["kind"] in ("kernel", "op"))
        lines.append(f"| {config} | {total:.3f} | {ranges} | {busy} |")
    return lines
