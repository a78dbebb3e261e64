"""`qsync-opt train` launched by torchrun itself: the same loss curve as our own launcher.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; each rank finds its
group from its global rank and applies that group's env (here the SSE4.1 cap of `sse41`) to itself.
Both runs use one thread per rank, so the arithmetic is the same sequence and the curves are equal.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "examples" / "cpu_tiny.yaml"
pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None
                                 and shutil.which("torchrun") is None, reason="torchrun not installed")]


def _losses(metrics: Path, rank: int) -> list[float]:
    recs = [json.loads(x) for x in (metrics / f"rank{rank}.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if "loss" in r]


def _run(argv, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=500, **kw)


def test_torchrun_trains_cpu_tiny_with_the_same_loss_curve_as_qsync_opt_train(tmp_path):
    plan = tmp_path / "plan.json"
    r = _run([sys.executable, "-m", "qsync_opt.cli", "solve", str(TINY), "-o", str(plan)])
    assert r.returncode == 0, r.stderr
    common = ["train", str(TINY), "--plan", str(plan), "--steps", "4", "--threads", "1"]
    ours = _run([sys.executable, "-m", "qsync_opt.cli", *common, "--metrics-dir", str(tmp_path / "ours")])
    assert ours.returncode == 0, ours.stderr[-3000:]
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    theirs = _run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "qsync_opt.cli", *common,
                   "--metrics-dir", str(tmp_path / "torchrun")])
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    a, b = _losses(tmp_path / "ours", 0), _losses(tmp_path / "torchrun", 0)
    assert len(a) == len(b) == 4
    assert a == b, f"loss curves differ: ours {a}, torchrun {b}"
    assert _losses(tmp_path / "torchrun", 1) == b, "both ranks log the same global-batch loss"
    starts = [json.loads(x) for r in (0, 1) for x in (tmp_path / "torchrun" / f"rank{r}.jsonl").read_text().splitlines()
              if '"start"' in x]
    assert [(s["rank"], s["group"]) for s in starts] == [(0, "native"), (1, "sse41")]
    assert starts[1]["env"] == {"ONEDNN_MAX_CPU_ISA": "SSE41"}


def test_torchrun_with_the_wrong_world_size_exits_2_saying_how_many(tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    plan = tmp_path / "plan.json"
    assert _run([sys.executable, "-m", "qsync_opt.cli", "solve", str(TINY), "-o", str(plan)]).returncode == 0
    r = _run([torchrun, "--standalone", "--nproc-per-node", "1", "-m", "qsync_opt.cli", "train", str(TINY),
              "--plan", str(plan), "--steps", "1"])
    assert r.returncode != 0
    assert "torchrun started WORLD_SIZE=1 processes but the spec's cluster has 2 device(s)" in r.stderr
    assert "Traceback" not in r.stderr.split("torchrun started")[0][-2000:]
