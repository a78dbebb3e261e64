"""The baselines LLM-PQ compares against, on the same instance and scored by the same `evaluate`.

* uniform: layers split evenly over the devices (earlier stages take the remainder), every
  layer at the highest bit-width that fits every device (what a user gets today);
* pipeedge: one bit-width for every layer (the highest for which any partition fits), the
  partition chosen to minimise the same predicted time (PipeEdge balances stage latency;
  searching the partition exactly under our objective is at least as good as its heuristic);
* adabits: the even partition, bits chosen for quality alone (least Σω that fits memory,
  then the fastest plan with that Σω) — adaptive bit-widths without latency awareness.

Each returns an Assignment or None when nothing of its kind fits.
"""

from __future__ import annotations

from dataclasses import replace

from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.serving.program import Assignment, ServingInstance, evaluate, solve_serving

BASELINES = ("uniform", "pipeedge", "adabits")

BASELINE_DOC = {
    "plan": "the planner's: LLM-PQ's phase-aware partition and adaptive per-layer bit-widths (Zhao et al., \"LLM-PQ: "
            "Serving LLM on Heterogeneous Clusters with Phase-Aware Partition and Adaptive Quantization\", PPoPP "
            "2024), solved as an integer program",
    "uniform": "layers split evenly over the devices, every layer at the highest bit-width that fits every device "
               "(what a user gets without a planner)",
    "pipeedge": "PipeEdge (Hu et al., \"PipeEdge: Pipeline Parallelism for Large-Scale Model Inference on "
                "Heterogeneous Edge Devices\", DSD 2022): one bit-width for every layer (the highest any partition "
                "fits), the partition chosen for the least predicted time",
    "adabits": "AdaBits (Jin et al., \"AdaBits: Neural Network Quantization with Adaptive Bit-Widths\", CVPR 2020): "
               "the even partition, bit-widths chosen for quality alone (the least Σω that fits memory), blind to "
               "latency",
}
"""What each row of the serving comparison is, with its paper: the legend `qsync-opt solve` prints under it."""


def even_sizes(layers: int, stages: int) -> tuple[int, ...]:
    q, r = divmod(layers, stages)
    return tuple(q + (1 if j < r else 0) for j in range(stages))


def _unbounded(inst: ServingInstance) -> ServingInstance:
    """Baselines know nothing of the plan's quality bound or penalty."""
    return replace(inst, max_indicator=None, theta=0.0)


def uniform(inst: ServingInstance) -> Assignment | None:
    inst = _unbounded(inst)
    sizes = even_sizes(inst.layers, len(inst.stages))
    if 0 in sizes:
        return None
    for b in sorted(inst.bits, reverse=True):
        a = Assignment(sizes, (b,) * inst.layers)
        if not evaluate(inst, a).violations:
            return a
    return None


def pipeedge(inst: ServingInstance, backend: str = "highs", options: SolveOptions | None = None) -> Assignment | None:
    inst = _unbounded(inst)
    for b in sorted(inst.bits, reverse=True):
        res = solve_serving(replace(inst, allowed_bits=(b,)), backend, options)
        if res.assignment is not None:
            return res.assignment
    return None


def adabits(inst: ServingInstance, backend: str = "highs", options: SolveOptions | None = None,
            solve=solve_serving) -> Assignment | None:
    """`solve` is `solve_serving` or a caller's wrapper of it (the planner's, which shares one time budget):
    a solve it declines for want of time returns None, and so does this baseline."""
    inst = _unbounded(inst)
    sizes = even_sizes(inst.layers, len(inst.stages))
    if 0 in sizes:
        return None
    options = options or SolveOptions()
    exact = replace(options, rel_gap=0.0)
    first = solve(replace(inst, stage_sizes=sizes, quality_only=True), backend, exact)
    if first is None or first.assignment is None:
        return None
    # lexicographic: the least Σω first, then the fastest plan with that Σω
    q = first.evaluation.quality
    second = solve(replace(inst, stage_sizes=sizes, max_indicator=q * (1 + 1e-9) + 1e-12), backend, options,
                   start=first.assignment)
    return (second.assignment if second is not None else None) or first.assignment


def all_baselines(inst: ServingInstance, backend: str = "highs", options: SolveOptions | None = None) -> dict[str, Assignment | None]:
    return {"uniform": uniform(inst), "pipeedge": pipeedge(inst, backend, options), "adabits": adabits(inst, backend, options)}
