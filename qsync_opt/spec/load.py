"""Reading a spec document, for every kind: a path, a YAML string, a dict or a model instance.

`read_document` gives the plain data, the text (for line numbers in errors) and where it came
from; `validate` turns it into a kind's job model with messages that name the field, the line
and the fix. A spec read from a file puts its folder (and the current directory) in front of
the import path, so a `model.import` or `data.import` factory beside the spec is found by every
command, as the ranks find it through PYTHONPATH.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from qsync_opt.errors import SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.spec.errors import format_errors
from qsync_opt.spec.importing import add_to_sys_path, import_paths
from qsync_opt.spec.yaml_loader import DuplicateKey, UniqueKeyLoader

M = TypeVar("M", bound=BaseModel)

SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def read_document(source: "str | Path | dict | BaseModel") -> tuple[dict, str | None, str]:
    """(data, text or None, origin) of a spec given as a path, YAML text, dict or model.

    A one-line string that names an existing path is read as that path; one that YAML reads as a
    bare word (`examples/cpu_tiny`) is a path that does not exist, and is reported so. A plan
    written by `qsync-opt solve` (of any kind: PLAN_MARKS) is refused as a plan, with where
    it goes instead, rather than checked field by field against a spec schema.
    """
    if isinstance(source, BaseModel):
        return source.model_dump(mode="json", by_alias=True), None, f"<{type(source).__name__}>"
    if isinstance(source, dict):
        refuse_plan(source, "<dict>")
        return source, None, "<dict>"
    text, origin = _read_text(source)
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader) or {}
    except DuplicateKey as e:
        raise SpecError(f"{origin}: {e}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{origin}: not valid YAML: {e}") from None
    if origin == "<string>" and isinstance(data, (str, int, float)) and "\n" not in str(source).strip():
        raise SpecError(_no_such_file(str(source).strip()))  # a bare word: a path, not a document
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: the spec must be a mapping (key: value), got {type(data).__name__}")
    refuse_plan(data, origin)
    return data, text, origin


#: Top-level keys that only a plan written by `qsync-opt solve` holds (no spec of any kind allows
#: them: every spec section refuses unknown keys), and what each plan is for.
PLAN_MARKS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("training", ("format_version", "groups", "fingerprint"), "pass it as --plan to `qsync-opt train` or "
     "`qsync-opt predict` with the spec it was solved from"),
    ("serving", ("stages", "spec_digest", "prediction"), "it records the pipeline solved from a serving spec "
     "(ServingPlan.load reads it)"),
    ("rollout", ("recommended", "policies", "spec_policy"), "`qsync-opt run` on the rollout spec draws and "
     "reports it"),
    ("loading", ("loading_plan_version", "split", "summary"), "it records the data plane's split of a loading "
     "spec's global batches (`qsync-opt report` prints it)"),
)


def plan_kind(data: Any) -> str | None:
    """The kind of plan `data` is (a kind named in PLAN_MARKS), or None when it is no plan."""
    if not isinstance(data, dict):
        return None
    for kind, keys, _ in PLAN_MARKS:
        if all(k in data for k in keys):
            return kind
    return None


def refuse_plan(data: dict, origin: str) -> None:
    """SpecError when `data` is a plan written by `qsync-opt solve` given where a spec belongs."""
    kind = plan_kind(data)
    if kind is None:
        return
    where = next(w for k, _, w in PLAN_MARKS if k == kind)
    raise SpecError(f"{origin} is a {kind} plan written by `qsync-opt solve`, not a spec; {where}. Give the job "
                    "spec (a YAML file such as examples/cpu_tiny.yaml) here")


def _no_such_file(name: str) -> str:
    hint = ""
    for suffix in SPEC_SUFFIXES:
        try:
            if Path(name + suffix).is_file():
                hint = f"; did you mean {name + suffix}?"
                break
        except (OSError, ValueError):
            break
    return (f"spec file {name!r} does not exist{hint or '; check the path (try examples/cpu_tiny.yaml)'} "
            "(a spec is a YAML file; from Python, YAML text or a dict also works)")


def _exists(source: str) -> bool:
    try:
        return Path(source).exists()
    except (OSError, ValueError):  # a name too long for the file system, or holding NUL: not a path
        return False


def _read_text(source: "str | Path") -> tuple[str, str]:
    one_line = isinstance(source, str) and "\n" not in source.strip()
    is_path = isinstance(source, Path) or (one_line and (source.endswith(SPEC_SUFFIXES) or _exists(source)))
    if not is_path:
        return str(source), "<string>"
    path = Path(source)
    if not _exists(str(path)):
        raise SpecError(_no_such_file(str(path)))
    text = read_text_file(path, "spec file", "a spec YAML file such as examples/cpu_tiny.yaml")
    add_to_sys_path(import_paths(path))
    return text, str(path)


def read_text_file(path: "str | Path", what: str, give: str) -> str:
    """The UTF-8 text of the file at `path`; SpecError naming `what` and `path` (and asking for `give`)
    when it does not exist, is a directory, cannot be read, is binary or is not UTF-8. One reader for
    every file a user names (spec, plan, saved problem), so each refuses the wrong file the same way."""
    path = Path(path)
    name = repr(str(path))
    if not _exists(str(path)):
        raise SpecError(f"{what} {name} does not exist; give {give}")
    if path.is_dir():
        found = sorted(p.name for p in path.iterdir() if p.suffix in SPEC_SUFFIXES)
        inside = f" (it holds {', '.join(found[:4])}{', ...' if len(found) > 4 else ''})" if found else ""
        raise SpecError(f"{what} {name} is a directory{inside}; give {give}")
    if not path.is_file():
        raise SpecError(f"{what} {name} is not a regular file; give {give}")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SpecError(f"{what} {name} cannot be read: {e.strerror or e}") from None
    if b"\x00" in raw:
        raise SpecError(f"{what} {name} is binary (it holds NUL bytes), not text; give {give}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{what} {name} is not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                        "save it as UTF-8") from None


@dataclass(frozen=True)
class Override:
    """An override's value and the words that name where it came from (`--backend gurobi`), so that an
    error in it blames that source, not the spec line it replaces."""

    value: Any
    source: str


def apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    """A copy of `data` with dotted-path overrides set, e.g. {"solver.backend": "cbc"} (a value may be an
    `Override`). An override below a key the spec gives as a scalar is not applied: validation then
    reports that key, with its line."""
    return _apply(data, overrides)[0]


def _apply(data: dict, overrides: "dict[str, Any] | None") -> tuple[dict, dict[tuple[str, ...], str]]:
    """(data with the overrides set, {field path: the source to blame for it})."""
    if not overrides:
        return data, {}
    data = json.loads(json.dumps(data))  # deep copy of plain data
    blame: dict[tuple[str, ...], str] = {}
    for dotted, value in overrides.items():
        source = value.source if isinstance(value, Override) else f"override {dotted}={value!r}"
        value = value.value if isinstance(value, Override) else value
        node = data
        *parents, leaf = dotted.split(".")
        blame[tuple(dotted.split("."))] = source
        for key in parents:
            node = node.setdefault(key, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[leaf] = value
    return data, blame


def validate(model: type[M], data: dict, text: str | None, origin: str,
             overrides: "dict[str, Any] | None" = None) -> M:
    """`model` validated from `data` with `overrides` (dotted paths, see `apply_overrides`) set; SpecError
    listing every problem with its field and line, or with the override's source where it is to blame."""
    data, blame = _apply(data, overrides)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_errors(e, text, origin, model, blame)) from None


def kind_of(data: dict, origin: str, known: "tuple[str, ...]") -> str:
    kind = data.get("kind", "training")
    if kind not in known:
        raise SpecError(f"{origin}: kind: {kind!r} is not a problem kind; use one of {', '.join(known)}")
    return kind


def save_plan_file(data: dict, path: "str | Path") -> Path:
    """Write a plan's JSON-mode dump atomically: YAML for a .yaml/.yml path, else JSON."""
    path = Path(path)
    text = yaml.safe_dump(data, sort_keys=False) if path.suffix in (".yaml", ".yml") else json.dumps(data, indent=2)
    return atomic_write_text(path, text)


def load_plan_file(model: type[M], path: "str | Path", kind: str) -> M:
    """The `kind` plan in the file at `path` (YAML by suffix, else JSON) as `model`; SpecError naming the file when
    it cannot be read, does not parse or is not such a plan, never a traceback."""
    command = f"`qsync-opt solve {kind.upper()}_SPEC -o plan.json`"
    text = read_text_file(Path(path), "plan file", f"a plan written by {command}")
    try:
        data = yaml.safe_load(text) if str(path).endswith((".yaml", ".yml")) else json.loads(text)
        return model.model_validate(data)
    except (ValueError, yaml.YAMLError) as e:  # JSONDecodeError and pydantic's ValidationError are ValueErrors
        raise SpecError(f"plan file {str(path)!r} is not a {kind} plan ({type(e).__name__}: "
                        f"{str(e).splitlines()[0]}); write one with {command}") from None

