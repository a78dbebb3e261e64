"""Omniload's data plane: per-sample cost, a balancer over ranks of unequal speed, a central
coordinator that mixes sources and hands each rank its sample ids, and its checkpoint.

Both a layer and a kind. As a layer below training, serving and rollout it imports
errors/io/precision, spec helpers, the solver's problem IR and backends, hardware, models, data
and `qsync_opt.kind`, never another kind; training passes it rank speeds as plain numbers. As the
`kind: loading` (spec.py, planner.py, plan.py, report.py, serve.py, kind.py) it plans and serves
the global batches of a loading spec for any trainer.
"""
