"""What the CLI prints is what the message says: no rich markup read out of text, no table cut
to 80 columns when stdout is a file."""

import pytest

from qsync_opt.cli import commands as cli
from qsync_opt.training.bench_solvers import _table
from qsync_opt.console import make_console
from qsync_opt.errors import InfeasibleError, QSyncError, SpecError

BRACKETED = [
    "install it with pip install 'sklearn' (or pip install 'qsync-opt[data]')",
    "cluster.groups[1].device: got [bold]x[/bold]",
    "a closing tag alone [/] must not crash the printer",
    "precisions [fp32, int8] and [link=https://x]",
]


@pytest.mark.parametrize("error, code", [(SpecError, 2), (InfeasibleError, 3), (QSyncError, 1)],
                         ids=["spec", "infeasible", "other"])
@pytest.mark.parametrize("message", BRACKETED, ids=range(len(BRACKETED)))
def test_error_messages_print_verbatim(monkeypatch, capsys, error, code, message):
    def boom(args):
        raise error(message)

    monkeypatch.setattr(cli, "_cmd_devices", boom)
    assert cli.main(["devices"]) == code
    assert message in capsys.readouterr().err


def test_the_missing_package_hint_keeps_its_extra(monkeypatch, capsys):
    from qsync_opt.data import builtin

    def missing(name, *a, **k):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr("importlib.import_module", missing)
    with pytest.raises(SpecError) as e:
        builtin._need("sklearn", "scikit-learn", "digits")
    make_console().print(str(e.value))
    assert "pip install 'qsync-opt[data]'" in capsys.readouterr().out


def test_tables_are_not_cut_when_stdout_is_a_file(capsys):
    case = "resnet50-on-a100x2-t4x6-with-a-long-name"
    row = {"case": case, "size": 161, "formulation": "mccormick", "backend": "highs", "status": "optimal",
           "build_s": 0.1, "solve_s": 0.2, "gap": 0.0, "objective": 1.0, "greedy_objective": 1.2}
    _table([row], make_console())  # capsys is not a terminal, like `qsync-opt bench solvers > f.txt`
    out = capsys.readouterr().out
    assert case in out and "optimal" in out and "1.200x" in out


@pytest.mark.slow  # builds every zoo model on the meta device (transformers import included)
def test_models_lists_input_shapes_and_operator_counts(capsys):
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "resnet50 " in x)
    assert "(B, 3, 224, 224) float32" in line and " 54 " in line  # 53 convolutions + fc
    assert "(B, 128) int64 token ids, vocab 30522" in next(x for x in out.splitlines() if "bert-base " in x)


def test_spec_shows_every_accepted_form(capsys):
    assert cli.main(["spec"]) == 0
    out = capsys.readouterr().out
    assert "allowed: auto | a number of ms > 0" in out  # max_iteration_time took numbers, but said "auto"
    assert "allowed: a number ≥ 0 (absolute) | a percentage such as '5%' | null" in out
    assert "allowed: an integer ≥ 1" in out and "allowed: a number > 0" in out
