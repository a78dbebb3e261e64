"""Fault injection on the files and settings a run reads: each gets exit 2 and a message, never a traceback.

These run in-process or fail before any rank starts, so they are fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from faults_helpers import ROOT, tiny_job

from qsync_opt.cli.commands import main
from qsync_opt.errors import SpecError
from qsync_opt.runtime import checkpoint as ckpt
from qsync_opt.training.runtime.trainer import env_threads


def train(spec, plan, *extra):
    return main(["train", str(spec), "--plan", str(plan), *map(str, extra)])


@pytest.mark.parametrize("damage", ["truncated", "not-a-mapping", "wrong-type", "binary"])
def test_a_damaged_plan_file_exits_2_naming_the_file(tmp_path, capsys, damage):
    spec, plan = tiny_job(tmp_path)
    text = plan.read_text()
    bad = {"truncated": text[: len(text) // 2], "not-a-mapping": "[1, 2]",
           "wrong-type": text.replace('"local_batch": 8', '"local_batch": "eight"', 1)}.get(damage)
    if bad is None:
        plan.write_bytes(b"\x80\x81\xfe" + text.encode()[:100])
    else:
        plan.write_text(bad)
    assert train(spec, plan) == 2
    err = capsys.readouterr().err
    assert str(plan) in err and "Traceback" not in err
    if damage == "wrong-type":
        assert "local_batch" in err


def _checkpoints(root, steps=(2, 4)):
    for s in steps:
        for r in (0, 1):
            ckpt.save_rank_files(root, s, r, **({"model_state": {}, "optimizer_state": {}, "meta": {}} if r == 0 else {}))
        ckpt.publish(root, s, keep=10)


def test_resume_falls_back_past_a_truncated_and_an_unmarked_checkpoint(tmp_path):
    _checkpoints(tmp_path, (2, 4, 6))
    s6 = ckpt.step_dir(tmp_path, 6) / "state.pt"
    s6.write_bytes(s6.read_bytes()[:40])
    (ckpt.step_dir(tmp_path, 4) / ckpt.MARKER).unlink()  # killed before the marker was written
    c = ckpt.choose(tmp_path)
    assert c.path == ckpt.step_dir(tmp_path, 2)
    assert [(p.name, why.split(" (")[0]) for p, why in c.skipped] == [
        ("step_00000006", "state.pt does not match its checksum"), ("step_00000004", "no COMPLETE marker")]
    state, rng = ckpt.load(tmp_path, 1)
    assert state["step"] == 2 and rng is not None


def test_a_flipped_byte_is_caught_by_the_checksum(tmp_path):
    _checkpoints(tmp_path, (2, 4))
    f = ckpt.step_dir(tmp_path, 4) / "rng_rank1.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    assert ckpt.choose(tmp_path, rank=1).path.name == "step_00000002"


def test_every_checkpoint_corrupt_exits_2_naming_the_directory(tmp_path, capsys):
    spec, plan = tiny_job(tmp_path)
    ck = tmp_path / "ck"
    _checkpoints(ck, (2, 4))
    for s in (2, 4):
        (ckpt.step_dir(ck, s) / "state.pt").write_bytes(b"PK\x03\x04 truncated")
    assert train(spec, plan, "--checkpoint-dir", ck, "--resume") == 2
    err = capsys.readouterr().err
    assert f"checkpoint_dir={str(ck)!r}: resume=True but no valid checkpoint is there" in err
    assert "step_00000004: state.pt does not match its checksum" in err and "Traceback" not in err


def test_resume_into_an_empty_directory_exits_2(tmp_path, capsys):
    spec, plan = tiny_job(tmp_path)
    assert train(spec, plan, "--checkpoint-dir", tmp_path / "none", "--resume") == 2
    assert "holds no step_*" in capsys.readouterr().err


@pytest.mark.parametrize("env, field", [
    ({"OMP_NUM_THREADS": "abc"}, "cluster.groups.1.env"),
    ({"OMP_NUM_THREADS": "0"}, "cluster.groups.1.env"),
    ({"LD_PRELOAD": "/tmp/x.so"}, "cluster.groups.1.env.LD_PRELOAD"),
    ({"PYTHONPATH": "/tmp"}, "cluster.groups.1.env.PYTHONPATH"),
], ids=["threads-abc", "threads-0", "ld-preload", "pythonpath"])
def test_bad_group_env_exits_2_before_any_rank_starts(tmp_path, capsys, env, field):
    spec, plan = tiny_job(tmp_path, **env)
    assert train(spec, plan) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


def test_code_loading_env_is_allowed_when_the_spec_says_so(tmp_path):
    from qsync_opt.training.spec import load_spec

    spec, _ = tiny_job(tmp_path, PYTHONPATH="/opt/mine")
    data = yaml.safe_load(spec.read_text())
    data["allow_code_env"] = True
    assert load_spec(data).cluster.groups[1].env == {"PYTHONPATH": "/opt/mine"}


def test_bad_thread_count_reaching_a_rank_is_a_spec_error(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    with pytest.raises(SpecError, match="OMP_NUM_THREADS='two' is not a positive integer"):
        env_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert env_threads(1) == 3


def test_a_rank_started_with_a_bad_rank_env_exits_2_without_a_traceback(tmp_path):
    spec, plan = tiny_job(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "first", "WORLD_SIZE": "2", "QSYNC_GROUP": "fast"}
    r = subprocess.run([sys.executable, "-m", "qsync_opt.training.runtime.worker", str(spec), "--steps", "1"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "rank first (fast): error: environment RANK='first': expected an integer" in r.stderr
    assert "Traceback" not in r.stderr


def test_duplicate_yaml_keys_exit_2_naming_the_line(tmp_path, capsys):
    spec, plan = tiny_job(tmp_path)
    text = spec.read_text()
    spec.write_text(text + "cluster:\n  groups: []\n")
    assert train(spec, plan) == 2
    err = capsys.readouterr().err
    line = len(text.splitlines()) + 1
    assert f"line {line}: key 'cluster' is given twice" in err


def test_a_corrupt_problem_file_exits_2(tmp_path, capsys):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"variables": 3})[:-2])
    assert main(["solve", "--problem", str(p)]) == 2
    assert main(["solve", "--problem", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert "p.json" in err and "missing.json" in err and "Traceback" not in err
