"""Names of a package imported when first used (PEP 562), so that importing the package imports none of them.

    __getattr__, __dir__ = lazy.names(__name__, {"apply_plan": "qsync_opt.runtime.apply", ...})

A name is looked up in its module on first access and kept in the package's namespace after that.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def names(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """(__getattr__, __dir__) for `package`: `where` maps each name to the module that defines it."""

    def getattr_(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return getattr_, dir_
