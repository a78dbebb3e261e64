"""Omniload's data plane: per-sample cost, a balancer over ranks of unequal speed, a central
coordinator that mixes sources and hands each rank its sample ids, and its checkpoint.

A shared layer below the problem kinds: it imports errors/io/precision, spec helpers, the
solver's problem IR and backends, hardware, models and data, never a kind (training,
serving, rollout). Training passes it rank speeds as plain numbers.
"""
