"""Resolve a user's 'package.module:attr' (model.import, data.import) to a callable.

One resolver for every spec field that names user code, so each gives the same help: the
field, the path, what went wrong, and a near-miss attribute name where there is one.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

from qsync_opt.errors import SpecError


def resolve_callable(path: str, field: str) -> Callable[..., Any]:
    """The callable at `path`; SpecError naming `field` when it cannot be imported or called."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise SpecError(f"{field}: got {path!r}; write it as 'package.module:factory'.")
    mod_name, attr = path.split(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise SpecError(
            f"{field}: cannot import module {mod_name!r} from {path!r} ({e}); check the name, and put "
            "the module beside the spec, in the current directory or on PYTHONPATH"
        ) from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing
        raise SpecError(f"{field}: importing {mod_name!r} raised {type(e).__name__}: {e}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            near = difflib.get_close_matches(part, names, n=3)
            hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
            raise SpecError(f"{field}: module {mod_name!r} has no attribute {part!r} (from {path!r}).{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SpecError(f"{field}: {path!r} is a {type(obj).__name__}, not a callable factory")
    return obj
