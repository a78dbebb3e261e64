"""Faults in a running serving pipeline (`qsync-opt run SERVING_SPEC`): a stage killed with kill -9 ends the run
with exit 1 naming the stage and its stderr's tail; SIGINT stops it with exit 4; no stage process is left."""

from __future__ import annotations

import signal
import time

import pytest
import yaml
from faults_helpers import HANG_S, children, cli, gone, kill, wait_for

pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(300)


def long_spec(tmp_path):
    spec = {"kind": "serving", "name": "long",
            "cluster": {"groups": [{"name": "a", "device": "cpu-local", "count": 1},
                                   {"name": "b", "device": "cpu-local", "count": 1}], "interconnect": "loopback"},
            "serving": {"model": {"layers": 2, "hidden": 32, "ffn": 64, "heads": 2, "vocab": 256, "max_positions": 128,
                                  "ffn_matrices": 3, "tied_embeddings": False},
                        "prompt_len": 8, "gen_tokens": 100, "global_batch": 4, "bits": [16],
                        "micro_batches": {"prefill": [1], "decode": [1]},
                        "runtime": {"family": "llama", "requests": 400}},
            "solver": {"time_limit_s": 10}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def started(out):
    ready = out / "pipeline" / "ready"
    return lambda: ready.is_dir() and len(list(ready.iterdir())) == 2


@pytest.mark.parametrize("stage", [0, 1])
def test_kill9_of_a_stage_ends_the_run_naming_it(tmp_path, stage):
    out = tmp_path / "out"
    proc = cli("run", str(long_spec(tmp_path)), "-o", str(out))
    wait_for(started(out), proc, what="both stages to join")
    stages = children(proc.pid)
    t_kill = kill(stages[stage])
    _, err = proc.communicate(timeout=HANG_S)
    print(f"\nkill -9 stage {stage}: exit {proc.returncode} {time.monotonic() - t_kill:.1f} s after the kill")
    assert proc.returncode == 1, err[-2000:]
    assert f"serving pipeline: rank {stage} (group {'ab'[stage]}[0], stage {stage}) was killed by SIGKILL" in err
    assert all(gone(p) for p in stages.values())
    assert not (out / "serve.json").exists() and not (out / "report.md").exists()


def test_sigint_stops_the_pipeline_with_exit_4(tmp_path):
    out = tmp_path / "out"
    proc = cli("run", str(long_spec(tmp_path)), "-o", str(out))
    wait_for(started(out), proc, what="both stages to join")
    stages = children(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 4, err[-2000:]
    assert "stopped by SIGINT while serving" in err
    assert all(gone(p) for p in stages.values())
    assert not (out / "serve.json").exists()
