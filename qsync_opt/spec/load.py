"""Reading a spec document, for every kind: a path, a YAML string, a dict or a model instance.

`read_document` gives the plain data, the text (for line numbers in errors) and where it came
from; `validate` turns it into a kind's job model with messages that name the field, the line
and the fix. A spec read from a file puts its folder (and the current directory) in front of
the import path, so a `model.import` or `data.import` factory beside the spec is found by every
command, as the ranks find it through PYTHONPATH.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from qsync_opt.errors import SpecError
from qsync_opt.spec.errors import format_errors
from qsync_opt.spec.importing import add_to_sys_path, import_paths
from qsync_opt.spec.yaml_loader import DuplicateKey, UniqueKeyLoader

M = TypeVar("M", bound=BaseModel)

SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def read_document(source: "str | Path | dict | BaseModel") -> tuple[dict, str | None, str]:
    """(data, text or None, origin) of a spec given as a path, YAML text, dict or model."""
    if isinstance(source, BaseModel):
        return source.model_dump(mode="json", by_alias=True), None, f"<{type(source).__name__}>"
    if isinstance(source, dict):
        return source, None, "<dict>"
    text, origin = _read_text(source)
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader) or {}
    except DuplicateKey as e:
        raise SpecError(f"{origin}: {e}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{origin}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: the spec must be a mapping (key: value), got {type(data).__name__}")
    return data, text, origin


def _read_text(source: "str | Path") -> tuple[str, str]:
    is_path = isinstance(source, Path) or (
        isinstance(source, str) and "\n" not in source and source.endswith(SPEC_SUFFIXES))
    if not is_path:
        return str(source), "<string>"
    path = Path(source)
    if not path.exists():
        raise SpecError(f"spec file {str(path)!r} does not exist; check the path (try examples/cpu_tiny.yaml)")
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} is not a file; give the path of a .yaml spec")
    raw = path.read_bytes()
    if b"\x00" in raw:
        raise SpecError(f"spec file {str(path)!r} is binary (it holds NUL bytes), not a YAML spec; "
                        "give a text file such as examples/cpu_tiny.yaml")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"spec file {str(path)!r} is not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                        "save it as UTF-8") from None
    add_to_sys_path(import_paths(path))
    return text, str(path)


def apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    """A copy of `data` with dotted-path overrides set, e.g. {"solver.backend": "cbc"}."""
    if not overrides:
        return data
    data = json.loads(json.dumps(data))  # deep copy of plain data
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return data


def validate(model: type[M], data: dict, text: str | None, origin: str) -> M:
    """`model` validated from `data`; SpecError listing every problem with its field and line."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_errors(e, text, origin, model)) from None


def kind_of(data: dict, origin: str, known: "tuple[str, ...]") -> str:
    kind = data.get("kind", "training")
    if kind not in known:
        raise SpecError(f"{origin}: kind: {kind!r} is not a problem kind; use one of {', '.join(known)}")
    return kind
