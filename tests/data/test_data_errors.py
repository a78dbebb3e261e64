"""A bad data section exits 2 with a message naming the field, before any rank starts; never a traceback."""

from __future__ import annotations

import re
import sys

import pytest
from data_jobs import fp32_plan, write_job

from qsync_opt.cli.commands import main


@pytest.fixture(autouse=True)
def _clean_imports(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("userdata", None)
    yield
    sys.modules.pop("userdata", None)


@pytest.mark.parametrize("data, message", [
    ({"import": "no_such_pkg.mod:make"}, r"data.import: cannot import module 'no_such_pkg.mod'"),
    ({"import": "userdata:nothere"}, r"data.import: module 'userdata' has no attribute 'nothere'"),
    ({"import": "userdata:broken"}, r"data.import: factory 'userdata:broken' raised RuntimeError: no such shard"),
    ({"import": "userdata:wrong_kind"}, r"data.import: 'userdata:wrong_kind' returned list"),
    ({"name": "mnist1d"}, r"data: samples have shape \[1, 40\] but model.input_shape is \[64\]"),
    ({"name": "mnist"}, r"data: samples have shape \[1, 28, 28\] but model.input_shape is \[64\]"),
], ids=["missing-module", "missing-factory", "factory-raises", "not-datasets", "shape-mnist1d", "shape-mnist"])
def test_bad_data_exits_2_naming_the_field(tmp_path, monkeypatch, capsys, data, message):
    monkeypatch.chdir(tmp_path)
    spec = write_job(tmp_path / "job", data=data)
    code = main(["train", str(spec), "--plan", str(fp32_plan(spec))])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert re.search(message, " ".join(err.split())), err


def test_samples_that_do_not_fit_the_models_layers_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    spec = write_job(tmp_path / "job", data={"name": "mnist1d"}, model={"name": "tiny-resnet"})
    code = main(["train", str(spec), "--plan", str(fp32_plan(spec))])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "data: samples of shape [[2, 1, 40]] (batch first) do not fit the model's input" in err


def test_labels_out_of_the_models_range_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    spec = write_job(tmp_path / "job", data={"name": "digits", "input_shape": [64]},
                     model={"import": "userdata:mlp", "input_shape": [64], "kwargs": {"width": 8}})
    (spec.parent / "userdata.py").write_text((spec.parent / "userdata.py").read_text().replace("Linear(width, 10)", "Linear(width, 3)"))
    code = main(["train", str(spec), "--plan", str(fp32_plan(spec))])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "but the model has 3 outputs" in err, err
