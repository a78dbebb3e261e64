"""`qsync-opt spec [--kind K]`: every field of a job spec, with its default, documentation and accepted values.

Each kind's job model is walked field by field (nested sections as dotted paths); the values a
field accepts are its Literal choices, the named presets it takes (devices, interconnects,
backends, transformer presets) and the forms its type admits (cli/spec_forms.py).
"""

from __future__ import annotations

from typing import Literal, get_args, get_origin

from pydantic import BaseModel

from qsync_opt.cli.spec_forms import accepted_forms
from qsync_opt.hardware.cluster import INTERCONNECTS
from qsync_opt.hardware.device import catalog
from qsync_opt.jobs import KINDS
from qsync_opt.llm.config import PRESETS
from qsync_opt.precision import PRECISIONS
from qsync_opt.solver.spec import BACKEND_NAMES
from qsync_opt.spec.errors import model_in



def _presets(key: str) -> list[str] | None:
    """Named values a field takes by its dotted path, or None: a complete list where one exists."""
    if key.endswith("solver.backend") and key != "rollout.solver.backend":  # rollout's backend is a Literal
        return list(BACKEND_NAMES)
    if key in ("cluster.interconnect", "rollout.relay_link"):
        return list(INTERCONNECTS)
    if key.endswith("model.preset"):
        return list(PRESETS)
    if key in ("cluster.groups.device.peak_tflops", "cluster.groups.device.efficiency"):
        return list(PRECISIONS)  # the names plans use; fp8_e4m3 and fp8_e5m2 share one rate
    if key == "cluster.groups.device":
        return [*catalog(), "{inline device}"]
    return None


def _literals(annotation) -> list[str]:
    out: list[str] = []

    def collect(ann) -> None:
        if get_origin(ann) is Literal:
            out.extend(str(a) for a in get_args(ann))
        else:
            for a in get_args(ann):
                collect(a)

    collect(annotation)
    return list(dict.fromkeys(out))


def field_lines(model: type[BaseModel], prefix: str = "", seen: frozenset = frozenset()) -> list[str]:
    """The documentation of every field of `model`, nested sections as dotted paths."""
    lines: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        default = "" if field.is_required() else f" (default: {field.get_default(call_default_factory=True)!r})"
        lines.append(f"{key}{default}")
        if field.description:
            lines.extend(f"    {line.strip()}" for line in field.description.strip().splitlines())
        presets = _presets(key)
        values = presets if presets is not None else _literals(field.annotation)
        if "{inline device}" not in values:  # a device list is complete as it is
            forms = accepted_forms(field, key)
            if presets is not None:  # the names are the strings it takes
                forms = [f for f in forms if f != "a string"]
            values = [*values, *(f for f in forms if f not in values)]
        if values:
            lines.append(f"    allowed: {' | '.join(values)}")
        nested = model_in(field.annotation)
        if nested is not None and nested not in seen:
            lines.extend(field_lines(nested, key + ".", seen | {nested}))
    return lines


def document(kinds: list[str]) -> str:
    """The spec documentation of each kind in `kinds`, each under a heading with its example."""
    parts = []
    default = next(iter(KINDS))
    for name in kinds:
        k = KINDS[name]
        head = f"# kind: {name}" + (" (the default)" if name == default else "")
        parts.append("\n".join([head, f"# {k.summary}; example: {k.example}", *field_lines(k.job_model)]))
    return "\n\n".join(parts)
