"""The dispatch table measured, not ruled: which implementation runs each low-precision operator, chosen by timing.

Under `runtime.kernels: auto`, a format can have more than one implementation on a device (kernels.dispatch.
kernel_choices: on the CPU, int8 and int4 through the templated GEMM and quantize kernels or through torch's ops and
oneDNN's int8 convolution). Which is faster depends on the device and the shape (docs/predictor.md has a CPU's
table), so the profiler races them, per shape class (`shape_class`: op kind, precision and forward
FLOPs within a factor FLOPS_CLASS), at the first op of each class it meets on that device:

- screen: each candidate runs one untimed and SCREEN_CALLS timed forwards; one that errors (a templated build that
  fails, an inexact GEMM it refuses) or is more than SCREEN_RATIO x the quickest forward drops out;
- race: the rest are timed forward and backward by the profiler's estimator; the least fwd + bwd wins.

The profile stores the winner per class (`Section.dispatch`: class -> {impl, candidates: what each measured,
at: the op raced at}); every op of the class is then timed with the winner alone, the whole steps run the
winners, the planner prices them and writes them into the plan (`GroupPlan.kernels`), and the trainer applies
them (runtime.apply_plan's `op_kernels`). A pinned `kernels` setting is not raced: it is the user's choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from qsync_opt.errors import KernelBuildError, SpecError

#: Forward FLOPs within this factor share a class (and its measured winner).
FLOPS_CLASS = 4
#: Screening: timed forward calls per candidate (after one untimed), and the ratio to the quickest that drops one.
SCREEN_CALLS = 2
SCREEN_RATIO = 1.5


def shape_class(node, precision: str) -> str:
    """The dispatch class of an op at `precision`: its kind, the precision and its forward FLOPs' bucket."""
    bucket = int(math.floor(math.log(max(1, node.fwd_flops), FLOPS_CLASS)))
    return f"{node.kind}|{precision}|flops~{FLOPS_CLASS}^{bucket}"


def race(candidates: tuple[str, ...], time_fwd: Callable[[str], float],
         time_op: Callable[[str], tuple[float, float]]) -> tuple[str, tuple[float, float], dict[str, dict]]:
    """(winner, its (fwd_ms, bwd_ms), what each candidate measured) of the module docstring's screen and race.

    `time_fwd(k)`: ms of the quickest of SCREEN_CALLS forwards (after one untimed) under kernels=k; `time_op(k)`:
    (fwd_ms, bwd_ms) by the profiler's estimator. A candidate whose calls raise SpecError or KernelBuildError (it
    cannot run this input here) is recorded with its error and left out; if every one does, the last error is
    raised."""
    screened: dict[str, float] = {}
    record: dict[str, dict] = {}
    error: Exception | None = None
    for k in candidates:
        try:
            screened[k] = time_fwd(k)
        except (SpecError, KernelBuildError) as e:
            error = e
            record[k] = {"error": str(e).splitlines()[0][:200]}
    if not screened:
        raise error  # type: ignore[misc]  # every candidate failed: the last one's reason
    best = min(screened.values())
    timed: dict[str, tuple[float, float]] = {}
    for k, ms in screened.items():
        if len(screened) > 1 and ms > SCREEN_RATIO * best:
            record[k] = {"screen_fwd_ms": ms}
            continue
        timed[k] = time_op(k)
        record[k] = {"screen_fwd_ms": ms, "fwd_ms": timed[k][0], "bwd_ms": timed[k][1]}
    winner = min(timed, key=lambda k: sum(timed[k]))
    return winner, timed[winner], record


def winners(dispatch: dict[str, dict], graph, precisions, kernels: str = "auto") -> dict[str, dict[str, str]]:
    """Selectable op -> precision -> the measured winner, for the (op, precision) pairs whose class the profile
    raced (the others run the spec's kernels setting); none under a pinned `kernels` (the user's choice runs)."""
    out: dict[str, dict[str, str]] = {}
    if kernels != "auto":
        return out
    for node in graph.selectable:
        for p in precisions:
            e = dispatch.get(shape_class(node, p))
            if e is not None:
                out.setdefault(node.name, {})[p] = e["impl"]
    return out
