"""A spec file that is not text, and user factories beside the spec: every command finds them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from qsync_opt.cli.commands import main

REPO = Path(__file__).resolve().parents[2]


def test_a_binary_spec_exits_2_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(bytes(range(256)) * 2)  # NUL bytes and every other byte, as random data has
    assert main(["solve", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "binary" in err
    assert "Traceback" not in err


def test_a_spec_that_is_not_utf8_exits_2_saying_so(tmp_path, capsys):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\n".encode("latin-1"))
    assert main(["solve", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "UTF-8" in err and "Traceback" not in err


MODEL = textwrap.dedent("""
    import torch.nn as nn

    def net(width=16):
        return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 4))
""")

SPEC = textwrap.dedent("""
    cluster:
      groups:
        - {name: a, device: cpu-local, count: 1}
    model: {import: "beside_spec_models_7f3:net", input_shape: [8]}
    training: {global_batch: 4}
    costs: roofline
    solver: {time_limit_s: 20}
""")


@pytest.mark.parametrize("command", [["solve"], ["solve", "--json"]])
def test_solve_finds_a_model_factory_beside_the_spec(tmp_path, command):
    """Run from another folder, with no PYTHONPATH: the spec's folder is where the factory is."""
    jobdir, elsewhere = tmp_path / "job", tmp_path / "elsewhere"
    jobdir.mkdir()
    elsewhere.mkdir()
    (jobdir / "beside_spec_models_7f3.py").write_text(MODEL)
    (jobdir / "spec.yaml").write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO)  # the package under test, not the user's code
    r = subprocess.run([sys.executable, "-m", "qsync_opt.cli", *command, str(jobdir / "spec.yaml")],
                       cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "No module named" not in r.stderr


def test_load_spec_of_a_file_puts_its_folder_on_the_import_path(tmp_path):
    import qsync_opt

    (tmp_path / "spec.yaml").write_text(SPEC)
    spec = qsync_opt.load_spec(tmp_path / "spec.yaml")
    assert spec.model.import_ == "beside_spec_models_7f3:net"
    assert str(tmp_path.resolve()) in sys.path
