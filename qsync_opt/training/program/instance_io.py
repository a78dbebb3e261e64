"""TrainingInstance <-> plain data, registered with the problem files (solver/export.py) so that
an exported training problem carries its instance and `solve --problem out.json` can decode it."""

from __future__ import annotations

from typing import Any

from qsync_opt.solver.export import num, register_source, unnum
from qsync_opt.training.program.greedy import greedy
from qsync_opt.training.program.instance import GroupInstance, TimeRow, TrainingInstance


def instance_to_dict(inst: TrainingInstance) -> dict[str, Any]:
    return {
        "objective": inst.objective,
        "max_degradation": inst.max_degradation,
        "omega": inst.omega,
        "groups": [
            {
                "name": g.name,
                "share": g.share,
                "allowed": {op: list(ps) for op, ps in g.allowed.items()},
                "time_ms": g.time_ms,
                "mem_bytes": g.mem_bytes,
                "cast_ms": [
                    {"a": a, "b": b, "costs": [[pa, pb, c] for (pa, pb), c in table.items()]} for (a, b), table in g.cast_ms.items()
                ],
                "fixed_ms": g.fixed_ms,
                "fixed_mem_bytes": g.fixed_mem_bytes,
                "time_bound_ms": g.time_bound_ms,
                "mem_capacity_bytes": num(g.mem_capacity_bytes),
                "sync_rows": [
                    {"name": r.name, "op_ms": r.op_ms, "const_ms": r.const_ms,
                     "cast_ms": [{"a": a, "b": b, "costs": [[pa, pb, c] for (pa, pb), c in t.items()]}
                                 for (a, b), t in r.cast_ms.items()]}
                    for r in g.sync_rows
                ],
            }
            for g in inst.groups
        ],
    }


def instance_from_dict(d: dict[str, Any]) -> TrainingInstance:
    groups = tuple(
        GroupInstance(
            name=g["name"],
            share=g["share"],
            allowed={op: tuple(ps) for op, ps in g["allowed"].items()},
            time_ms=g["time_ms"],
            mem_bytes=g["mem_bytes"],
            cast_ms={(e["a"], e["b"]): {(pa, pb): c for pa, pb, c in e["costs"]} for e in g["cast_ms"]},
            fixed_ms=g["fixed_ms"],
            fixed_mem_bytes=g["fixed_mem_bytes"],
            time_bound_ms=g["time_bound_ms"],
            mem_capacity_bytes=unnum(g["mem_capacity_bytes"]),
            sync_rows=tuple(
                TimeRow(name=r["name"], op_ms=r["op_ms"], const_ms=r["const_ms"],
                        cast_ms={(e["a"], e["b"]): {(pa, pb): c for pa, pb, c in e["costs"]} for e in r["cast_ms"]})
                for r in g.get("sync_rows", ())
            ),
        )
        for g in d["groups"]
    )
    return TrainingInstance(groups=groups, omega=d["omega"], objective=d["objective"], max_degradation=d["max_degradation"])


register_source("training", TrainingInstance, instance_to_dict, instance_from_dict, heuristic=greedy)
