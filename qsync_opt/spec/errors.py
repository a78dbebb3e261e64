"""Turn pydantic's validation errors into messages a user can act on.

Each line names the field path, the YAML line it stands on, what was wrong, what was given,
and for a mistyped key the nearest allowed name: a typo should cost seconds, not a search.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError


def format_errors(err: ValidationError, text: str | None, origin: str, root: type[BaseModel],
                  blame: "dict[tuple[str, ...], str] | None" = None) -> str:
    """One line per problem: the field path, its YAML line, what was wrong and what was given.

    `blame` maps field paths an override set to the override's source (`--backend gurobi`): a
    problem at, above or below such a path is that source's, and names it instead of the spec line.
    """
    errors = _drop_union_noise(err.errors())
    lines = []
    from_spec = False
    for e in errors:
        loc = [p for p in e["loc"] if not _is_union_tag(p)]
        path = ".".join(str(p) for p in loc) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown field {str(loc[-1])!r}" + _suggest_field(root, loc)
        elif e["type"] == "missing":
            msg = "required field is missing"
        if not loc and e["type"] == "value_error":  # a whole-spec rule: its message names the fields itself
            source = _blamed(_leading_path(msg), blame)
            from_spec |= source is None
            lines.append(f"  - {source}: {msg}" if source else f"  - {_with_line(msg, text)}")
            continue
        got = "" if e["type"] in ("missing",) else f"; got {_short(e.get('input'))}"
        source = _blamed(loc, blame)
        if source is not None:
            lines.append(f"  - {source} (sets {'.'.join(next(p for p in blame if _overlaps(p, loc)))}): {msg}{got}")
            continue
        from_spec = True
        line = _line_of(text, loc) if text else None
        where = f" (line {line})" if line else ""
        lines.append(f"  - {path}{where}: {msg}{got}")
    n = len(errors)
    what = f"{origin}: invalid job spec" if from_spec else f"{origin}: an override is invalid for this spec"
    return "\n".join([f"{what} ({n} problem{'s' * (n > 1)}):", *lines])


def _overlaps(path: "tuple[str, ...]", loc) -> bool:
    loc = tuple(str(p) for p in loc)
    k = min(len(path), len(loc))
    return k > 0 and path[:k] == loc[:k]


def _blamed(loc, blame) -> str | None:
    """The source of the override whose path is `loc`, above it or below it; None when the spec is to blame."""
    if not blame or not loc:
        return None
    return next((source for path, source in blame.items() if _overlaps(path, loc)), None)


def _with_line(msg: str, text: str | None) -> str:
    """A whole-spec rule whose message starts with a field path ('cluster.groups.1.memory_gb: ...')
    gets that field's YAML line, like a field rule."""
    m = re.match(r"([A-Za-z_][\w]*(?:\.[\w]+)+): ", msg)
    if not (m and text):
        return msg
    loc = [int(p) if p.isdigit() else p for p in m.group(1).split(".")]
    line = _line_of(text, loc)
    return f"{m.group(1)} (line {line}): {msg[m.end():]}" if line else msg


def _leading_path(msg: str) -> list:
    m = re.match(r"([A-Za-z_][\w]*(?:\.[\w]+)+): ", msg)
    return m.group(1).split(".") if m else []


def _drop_union_noise(errors: list[dict]) -> list[dict]:
    """Drop "Input should be a valid string" for a mapping given to a `str | Model` field.

    The mapping was meant for the model branch (an inline device or link), whose own errors
    say what is wrong; the string branch's complaint only misleads.
    """
    def loc(e):
        return tuple(p for p in e["loc"] if not _is_union_tag(p))

    deeper = [loc(e) for e in errors]
    keep = []
    for e in errors:
        here = loc(e)
        noise = (e["type"] == "string_type" and isinstance(e.get("input"), dict)
                 and any(len(d) > len(here) and d[:len(here)] == here for d in deeper))
        if not noise:
            keep.append(e)
    return keep or errors


def _is_union_tag(p) -> bool:
    return isinstance(p, str) and (p in ("str", "DeviceSpec", "Interconnect", "float") or p.startswith(("literal[", "function-")))


def _suggest_field(root: type[BaseModel], loc) -> str:
    model = root
    for p in loc[:-1]:
        if isinstance(p, int):
            continue
        field = model.model_fields.get(str(p))
        ann = getattr(field, "annotation", None)
        nested = model_in(ann)
        if nested is None:
            return ""
        model = nested
    names = [f.alias or n for n, f in model.model_fields.items()]
    near = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.5)
    return (f"; did you mean {near[0]!r}?" if near else "") + f" Allowed: {', '.join(names)}"


def model_in(ann):
    """The pydantic model inside an annotation (through Optional/Union/list), if any."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in get_args(ann):
        m = model_in(a)
        if m is not None:
            return m
    return None


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _line_of(text: str, loc: list) -> int | None:
    """Line (1-based) of the deepest YAML node on `loc` that exists in the document."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == str(key)), None)
            keynode = next((k for k, v in node.value if k.value == str(key)), None)
            if match is None:
                break
            line, node = keynode.start_mark.line + 1, match
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line
