"""`qsync-opt spec` documents every kind's fields, not only training's."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from qsync_opt.cli import commands
from qsync_opt.cli.spec_doc import field_lines
from qsync_opt.jobs import KINDS
from qsync_opt.spec.errors import model_in


def _paths(model: type[BaseModel], prefix: str = "", seen: frozenset = frozenset()) -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        out.append(key)
        nested = model_in(field.annotation)
        if nested is not None and nested not in seen:
            out.extend(_paths(nested, key + ".", seen | {nested}))
    return out


def test_spec_without_kind_documents_every_kind(capsys):
    assert commands.main(["spec"]) == 0
    out = capsys.readouterr().out
    for kind in KINDS:
        assert f"# kind: {kind}" in out
    # a field of each kind's own section
    for field in ("objective.max_iteration_time", "serving.micro_batches.decode", "rollout.policy.eta",
                  "rollout.repack.method"):
        assert any(line.split(" ")[0] == field for line in out.splitlines()), field


@pytest.mark.parametrize("kind", KINDS)
def test_spec_kind_lists_every_field_of_that_kind(capsys, kind):
    assert commands.main(["spec", "--kind", kind]) == 0
    out = capsys.readouterr().out
    keys = {line.split(" ")[0] for line in out.splitlines() if line and not line.startswith((" ", "#"))}
    assert keys == set(_paths(KINDS[kind].job_model))
    assert all(f"# kind: {other}" not in out for other in KINDS if other != kind)


def test_the_kind_flag_offers_exactly_the_registered_kinds(capsys):
    with pytest.raises(SystemExit):
        commands.main(["spec", "--kind", "nope"])
    err = capsys.readouterr().err
    assert all(repr(k) in err for k in KINDS)


def test_preset_names_are_listed_as_the_whole_choice():
    lines = field_lines(KINDS["serving"].job_model)
    preset = lines[lines.index(next(x for x in lines if x.startswith("serving.model.preset"))) + 2]
    assert "opt-30b" in preset and "llama-3-70b" in preset and "a string" not in preset
