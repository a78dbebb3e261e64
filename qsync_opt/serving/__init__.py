"""Serving (LLM-PQ): layer partition, per-layer bit-width and micro-batch sizes for an LLM on a
pipeline of unlike GPUs. Reads in pipeline order: spec, costs, quality, instance, program,
bounds, baselines, planner, plan, report."""
