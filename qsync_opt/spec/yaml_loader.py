"""What the spec's YAML may hold beyond its schema: one value per key, and which env keys load code.

Kept apart from spec.py so the schema stays readable; both rules exist so that nothing in a
spec passes silently (a repeated key, where YAML keeps the last) or runs code unannounced.
"""

from __future__ import annotations

import yaml

#: Group env keys that make a process load code of the spec's choosing (the dynamic loader,
#: the interpreter, compilers of the kernels): refused unless the spec sets allow_code_env.
CODE_ENV: tuple[str, ...] = (
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "DYLD_LIBRARY_PATH",
    "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONBREAKPOINT", "PYTHONWARNINGS",
    "PATH", "CC", "CXX", "TORCH_EXTENSIONS_DIR",
)

#: Group env keys that must be positive integers (thread pools read them at start-up).
INT_ENV: tuple[str, ...] = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def loads_code(key: str) -> bool:
    return key in CODE_ENV or key.startswith(("LD_", "DYLD_"))


class DuplicateKey(Exception):
    pass


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error (not 'the last wins')."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key == "<<" or key not in seen:
                    seen[key] = line
                    continue
            except TypeError:  # an unhashable key: let SafeLoader report it
                continue
            first = seen[key]
            raise DuplicateKey(f"line {line}: key {key!r} is given twice in one mapping (first on line "
                                f"{first}); YAML would silently keep only the last, so merge them into one")
        return super().construct_mapping(node, deep=deep)
