"""Training (QSync): synchronous data parallelism where weak devices get just enough
low-precision operators to keep pace. Reads in pipeline order: spec, predictor (profiles, costs,
indicators, replayer), program (instance, compile, solve, bounds), baselines, refine, batch_split,
pipeline, plan, report; runtime (launch, trainer, worker) and run (profile -> plan -> train -> report)."""
