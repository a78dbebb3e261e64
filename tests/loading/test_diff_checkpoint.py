"""Differential data-plane checkpoints: a full state every `full_every` saves, only what
changed in between; a resume after kill -9 continues the exact sample-id sequence."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from qsync_opt.errors import SpecError
from qsync_opt.loading.checkpoint import DiffCheckpointer, diff, patch, resolve
from tests.loading.plane_cases import make_plane


def test_diff_patch_roundtrip():
    a = {"step": 3, "sources": [{"name": "s", "cursor": 1}, {"name": "l", "cursor": 0}], "deficit": [0.5, -0.5]}
    b = {"step": 4, "sources": [{"name": "s", "cursor": 9}, {"name": "l", "cursor": 0}], "deficit": [0.25, -0.25]}
    d = diff(a, b)
    assert sorted(tuple(map(str, p)) for p, _ in d) == [("deficit", "0"), ("deficit", "1"), ("sources", "0", "cursor"),
                                                         ("step",)]
    assert patch(a, d) == b and a["step"] == 3  # base untouched
    assert patch(a, diff(a, {**b, "sources": b["sources"][:1]})) == {**b, "sources": b["sources"][:1]}  # shape change


def test_full_every_and_deltas_resolve(tmp_path):
    plane = make_plane()
    ck = DiffCheckpointer(tmp_path / "dp", full_every=4)
    kinds, states = [], []
    for _ in range(10):
        plane.next_batch()
        st = plane.state_dict()
        rec = json.loads(json.dumps(ck.record(plane.step, st)))  # as it comes back from disk
        kinds.append(rec["kind"])
        states.append((rec, st))
        if rec["kind"] == "delta":  # only what changed: never the names, sizes, seed or version
            paths = {p[0] for p, _ in rec["delta"]}
            assert paths <= {"step", "sources", "deficit"} and len(json.dumps(rec["delta"])) < len(json.dumps(st))
    assert kinds == ["full", "delta", "delta", "delta"] * 2 + ["full", "delta"]
    for rec, st in states:
        assert resolve(tmp_path / "dp", rec) == st
    # the bases named by the two newest records survive a prune; older full states go
    gone = ck.prune()
    assert [p.name for p in gone] == ["full_00000001.json", "full_00000005.json"]
    assert resolve(tmp_path / "dp", states[-1][0]) == states[-1][1]


def test_corrupted_or_missing_base_is_refused(tmp_path):
    plane = make_plane()
    ck = DiffCheckpointer(tmp_path / "dp", full_every=3)
    plane.next_batch()
    ck.record(plane.step, plane.state_dict())
    plane.next_batch()
    rec = ck.record(plane.step, plane.state_dict())
    base = tmp_path / "dp" / "full_00000001.json"
    base.write_text(base.read_text().replace('"step":1', '"step":7'))
    with pytest.raises(SpecError, match="checksum"):
        resolve(tmp_path / "dp", rec)
    base.unlink()
    with pytest.raises(SpecError, match="missing"):
        resolve(tmp_path / "dp", rec)
    with pytest.raises(SpecError, match="full_every"):
        DiffCheckpointer(tmp_path, full_every=0)


SCRIPT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    from tests.loading.plane_cases import make_plane
    from qsync_opt.loading.checkpoint import DiffCheckpointer, save_state, load_state
    ckpt, log, resume, steps, slow = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), sys.argv[5] == "1"
    plane = make_plane()
    dc = DiffCheckpointer(ckpt + ".store", full_every=int(sys.argv[6]))
    if resume:  # the training checkpoint holds only the record: full, or a delta on a full one in the store
        plane.load_state_dict(dc.restore(load_state(ckpt)))
    with open(log, "a") as f:
        while plane.step < steps:
            plan = plane.next_batch()
            f.write(json.dumps([plan.step, plan.samples, plan.owner]) + "\\n"); f.flush()
            save_state(ckpt, dc.record(plane.step, plane.state_dict()))
            dc.prune()
            if slow:
                time.sleep(0.05)
""")


def test_resume_after_kill_from_a_delta_is_exact(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(root=root))
    env = {**os.environ, "PYTHONPATH": root}
    ref_log, log, ckpt = tmp_path / "ref.jsonl", tmp_path / "run.jsonl", tmp_path / "ckpt.json"
    subprocess.run([sys.executable, str(script), str(tmp_path / "ref.json"), str(ref_log), "0", "30", "0", "5"],
                   check=True, env=env, timeout=120)
    p = subprocess.Popen([sys.executable, str(script), str(ckpt), str(log), "0", "30", "1", "1000"], env=env)
    deadline = time.time() + 60
    # full_every 1000: one full state at step 1, then deltas only, so the kill leaves a delta
    while time.time() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 8):
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    rec = json.loads(ckpt.read_text())
    assert rec["kind"] == "delta" and rec["base_step"] == 1
    done = resolve(str(ckpt) + ".store", rec)["step"]
    assert 5 <= done < 30
    lines = log.read_text().splitlines()[:done]  # a step logged after its checkpoint is replayed
    log.write_text("".join(line + "\n" for line in lines))
    subprocess.run([sys.executable, str(script), str(ckpt), str(log), "1", "30", "0", "1000"], check=True, env=env, timeout=120)
    assert log.read_text() == ref_log.read_text()
    # the resumed run went on differentially: its last record is a delta on a full state it wrote
    last = json.loads(ckpt.read_text())
    assert last["kind"] == "delta" and last["base_step"] > done
