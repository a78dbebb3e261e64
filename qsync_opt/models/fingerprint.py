"""A graph's fingerprint: each selectable operator's FQN, kind and weight shape.

Plans carry it, and `apply_plan` compares it with the module it is given, so a plan never
lands on another model whose operator names merely overlap.
"""

from __future__ import annotations

import hashlib
import json
import re

from pydantic import BaseModel, ConfigDict

_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class GraphFingerprint(BaseModel):
    """What model a plan was solved for: each selectable operator's name, kind and weight shape.

    `apply_plan` compares it with the module it is given, so a plan never lands on another
    model whose operator names merely overlap.
    """

    model_config = _CONFIG

    digest: str
    """SHA-256 (16 hex digits) over `ops`, for a quick equality check."""
    ops: dict[str, str]
    """Operator FQN -> 'kind[weight shape]', e.g. 'conv2d[16,3,3,3]', in graph order."""


_FUNCTIONAL_OP = re.compile(r"(^|\.)[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*_\d+$")
"""Names the tracer gives functional ops (`<parent>.<fn>_<k>`): they have no module to compare."""


def op_signature(kind: str, weight_shape) -> str:
    return f"{kind}[{','.join(str(int(d)) for d in (weight_shape or ()))}]"


def make_fingerprint(ops: dict[str, str]) -> GraphFingerprint:
    blob = json.dumps(sorted(ops.items())).encode()
    return GraphFingerprint(digest=hashlib.sha256(blob).hexdigest()[:16], ops=dict(ops))


def graph_fingerprint(graph) -> GraphFingerprint:
    """The fingerprint of a traced OpGraph: its selectable operators with their weight shapes."""
    return make_fingerprint({n.name: op_signature(n.kind, n.weight_shape) for n in graph.nodes if n.selectable})


_GEMM_KINDS = {"matmul", "bmm"}


def _stand_in_for(module_sig: str, plan_sig: str) -> bool:
    """A module that holds no weight of its own (the weight arrives as an argument, as in the
    modules `models.rewrite` puts in place of a functional call) can only be checked by kind;
    torch.matmul and torch.bmm both become a MatMul."""
    if not module_sig.endswith("[]"):
        return False
    have, want = module_sig.split("[")[0], plan_sig.split("[")[0]
    return have == want or {have, want} <= _GEMM_KINDS


def fingerprint_mismatch(want: GraphFingerprint, have: dict[str, str]) -> str | None:
    """The first difference between a plan's fingerprint and a module's module ops, or None.

    `have` holds the module's swappable modules (FQN -> signature); the plan's functional ops
    (no module of their own) are compared only by absence from `have`.
    """
    if make_fingerprint(have).digest == want.digest:
        return None
    for name, sig in want.ops.items():
        if name in have and have[name] != sig and not _stand_in_for(have[name], sig):
            return f"operator {name!r} is {have[name]} in the model but {sig} in the plan"
    for name, sig in have.items():
        if name not in want.ops:
            return f"operator {name!r} ({sig}) is in the model but not in the plan's graph"
    missing = [n for n in want.ops if n not in have and not _FUNCTIONAL_OP.search(n)]
    if missing:
        return f"operator {missing[0]!r} ({want.ops[missing[0]]}) of the plan's graph is not in the model"
    return None
