"""Small serving instances for the exactness tests: random costs, and ones built from a spec."""

from __future__ import annotations

import random

from qsync_opt.serving.program import ServingInstance, StageData

GB = 1e9


def random_instance(seed: int, layers: int = 5, stages: int = 3, bits=(4, 8, 16), identical: bool = False) -> ServingInstance:
    r = random.Random(seed)
    out = []
    for j in range(stages):
        speed = r.uniform(0.5, 2.0)
        out.append(StageData(
            name=f"d{j}", device=f"dev{j % 2}",
            pre_ms={b: speed * r.uniform(1.0, 1.3) * (1.15 if b < 16 else 1.0) for b in bits},
            dec_ms={b: speed * (0.1 * b / 16 + 0.02) * r.uniform(0.9, 1.1) for b in bits},
            mem_bytes={b: (b / 8 + 0.4) * GB for b in bits},
            fixed_pre_ms=0.3 if j == 0 else 0.0, fixed_dec_ms=0.05 if j == 0 else 0.0,
            fixed_mem_bytes=0.2 * GB + (0.3 * GB if j == 0 else 0.0),
            capacity_bytes=r.uniform(1.5, 7.0) * GB,
        ))
    base = {b: 0.0 if b == 16 else 1.0 / (2 ** (b - 1) - 1) ** 2 for b in bits}
    omega = tuple(dict(base) if identical else {b: v * r.uniform(0.3, 3.0) for b, v in base.items()} for _ in range(layers))
    full = sum(max(o.values()) for o in omega)
    return ServingInstance(
        stages=tuple(out), bits=tuple(bits), omega=omega,
        m_pre=r.choice([1, 2, 4]), m_dec=r.choice([1, 2, 3, 8]), decode_rounds=r.choice([0, 1, 15]),
        comm_pre_ms=r.uniform(0.0, 0.5), comm_dec_ms=r.uniform(0.0, 0.05),
        max_indicator=r.choice([None, 0.2 * full, 0.6 * full]), theta=r.choice([0.0, 0.0, 5.0]),
    )
