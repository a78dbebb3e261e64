"""The accepted forms of a spec field, for `qsync-opt spec`: "auto | a number > 0", not "auto".

Literal choices are listed by the CLI itself (with named presets); this adds what the type
admits besides them: numbers (with their bounds), integers, strings, lists, mappings, sections,
null. Bounds come from the field's constraints (pydantic's Field(ge=..., gt=...))."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel


def _bounds(metadata: list[Any]) -> str:
    parts = []
    for m in metadata:
        for attr, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                parts.append(f"{sym} {v:g}" if isinstance(v, (int, float)) else f"{sym} {v}")
    return (" " + " and ".join(parts)) if parts else ""


def _forms(ann, bounds: str, out: list[str], literal_strings: bool) -> None:
    origin = get_origin(ann)
    if origin is Literal:
        return
    if origin in (Union, types.UnionType):
        for a in get_args(ann):
            _forms(a, bounds, out, literal_strings)
        return
    if ann is type(None):
        out.append("null")
    elif ann is bool:
        out.append("true | false")
    elif ann is int:
        out.append(f"an integer{bounds}")
    elif ann is float:
        out.append(f"a number{bounds}")
    elif ann is str:
        if not literal_strings:
            out.append("a string")
    elif origin in (list, tuple, set) or ann in (list, tuple):
        out.append("a list")
    elif origin is dict or ann is dict:
        out.append("a mapping")
    elif isinstance(ann, type) and issubclass(ann, BaseModel):
        out.append("a section (fields below)")


VALIDATED = {
    "objective.max_iteration_time": ["a number of ms > 0"],
    "objective.max_accuracy_degradation": ["a number ≥ 0 (absolute)", "a percentage such as '5%'", "null"],
}
"""Fields whose validator narrows what the type admits: their forms, as the validator accepts them."""


def accepted_forms(field, key: str = "") -> list[str]:
    """Forms a pydantic FieldInfo admits besides its Literal choices, e.g. ['a number > 0']."""
    if key in VALIDATED:
        return list(VALIDATED[key])
    ann = field.annotation
    literal_strings = any(get_origin(a) is Literal for a in (get_args(ann) or (ann,)))
    out: list[str] = []
    _forms(ann, _bounds(list(field.metadata)), out, literal_strings)
    return list(dict.fromkeys(out))
