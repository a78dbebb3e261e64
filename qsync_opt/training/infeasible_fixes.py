"""Fixes for an infeasible training spec that need the model again: precisions a group was not
allowed (`cluster.groups[].precisions`) although its device runs them.

training/program/diagnose.py proves what it can from the instance alone (the least feasible time bound,
the least indicator budget); a precision the spec left out has no costs in that instance, so
here the instance is rebuilt with the group's formats widened and solved exactly: a fix is
listed only when that solve finds a plan. The smallest such change is preferred: one added
format where one suffices, else every format the device runs."""

from __future__ import annotations

from qsync_opt.errors import InfeasibleError, QSyncError
from qsync_opt.training import solving
from qsync_opt.training.solving import build_training_instance


def precision_fixes(spec, prepared, budget, local_batches=None) -> list[str]:
    """'fix: ...' lines for restricted groups whose widened formats give a plan (checked)."""

    restricted = {g.name: [p for p in g.device_spec.precisions if p not in g.allowed_precisions]
                  for g in spec.cluster.groups if g.precisions is not None}
    restricted = {n: extra for n, extra in restricted.items() if extra}
    if not restricted:
        return []

    def feasible(add: dict[str, list[str]]) -> bool:
        groups = []
        for i, g in enumerate(spec.cluster.groups):
            data = g.model_dump(mode="json", by_alias=True)
            if g.name in add:
                data["precisions"] = [*g.allowed_precisions, *add[g.name]]
            groups.append(data)
        trial = spec.model_validate({**spec.model_dump(mode="json", by_alias=True),
                                     "cluster": {**spec.cluster.model_dump(mode="json", by_alias=True), "groups": groups}})
        try:
            instance, _ = build_training_instance(trial, prepared, local_batches)
            solving.run_backend(trial, instance, budget)
            return True
        except (InfeasibleError, QSyncError):
            return False

    index = {g.name: i for i, g in enumerate(spec.cluster.groups)}

    def words(add: dict[str, list[str]]) -> str:
        return "; ".join(f"cluster.groups[{index[n]}].precisions ({n}): add {', '.join(ps)}" for n, ps in add.items())

    for p in dict.fromkeys(p for extra in restricted.values() for p in extra):  # one format, highest first
        add = {n: [p] for n, extra in restricted.items() if p in extra}
        if not budget.exhausted and feasible(add):
            return [f"fix: {words(add)} (checked: the program then has a plan)"]
    if len(restricted) and not budget.exhausted and feasible(restricted):
        return [f"fix: {words(restricted)} (checked: the program then has a plan)"]
    return []
