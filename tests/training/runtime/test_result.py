"""What `qsync-opt train` reports: status, exit code, and events of this attempt only."""

from __future__ import annotations

import json

from qsync_opt.training.runtime.launch import _collect
from qsync_opt.runtime.spawn import Spawned
from qsync_opt.training.runtime.trainer import EXIT_STOPPED


def _write(path, records):
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def _steps(a, b):
    return [{"step": s, "loss": 1.0 / s, "step_ms": 10.0} for s in range(a, b + 1)]


def test_a_stop_event_of_an_earlier_attempt_does_not_leak_into_a_completed_resume(tmp_path):
    """The issue's case: after a SIGTERM stop and a completed resume the summary said 'stopped'."""
    for r in (0, 1):
        _write(tmp_path / f"rank{r}.jsonl", [{"event": "start"}, *_steps(1, 20), {"event": "stopped", "step": 20}])
    offsets = {r: (tmp_path / f"rank{r}.jsonl").stat().st_size for r in (0, 1)}
    for r in (0, 1):
        _write(tmp_path / f"rank{r}.jsonl", [{"event": "start"}, *_steps(21, 25), {"event": "completed", "step": 25}])
    res = _collect(Spawned([0, 0]), tmp_path, 16, None, offsets)
    assert res.status == "completed" and res.exit_code == 0 and not res.stopped
    assert res.steps_done == 25 and len(res.losses) == 25, "the loss curve spans both attempts"
    assert res.summary()["status"] == "completed"


def test_a_stopped_attempt_exits_4_and_says_stopped(tmp_path):
    for r in (0, 1):
        _write(tmp_path / f"rank{r}.jsonl", [{"event": "start"}, *_steps(1, 3), {"event": "stopped", "step": 3}])
    res = _collect(Spawned([EXIT_STOPPED, EXIT_STOPPED]), tmp_path, 16, None, {0: 0, 1: 0})
    assert res.status == "stopped" and res.exit_code == EXIT_STOPPED == 4
    assert res.summary()["status"] == "stopped"


def test_a_failed_rank_is_failed_even_after_a_stop_and_keeps_the_input_error_code(tmp_path):
    _write(tmp_path / "rank0.jsonl", [*_steps(1, 2), {"event": "stopped", "step": 2}])
    failed = Spawned([-15, 2], failure="rank 1 (group slow) exited with code 2 after 1.0 s", failed_code=2)
    res = _collect(failed, tmp_path, 16, None, {0: 0, 1: 0})
    assert res.status == "failed" and res.exit_code == 2 and "rank 1 (group slow)" in res.summary()["failure"]
    killed = Spawned([-9, -15], failure="rank 0 (group fast) was killed by SIGKILL", failed_code=-9)
    assert _collect(killed, tmp_path, 16, None, {}).exit_code == 1


def test_a_line_cut_by_a_kill_is_skipped_not_fatal(tmp_path):
    (tmp_path / "rank0.jsonl").write_text(json.dumps(_steps(1, 1)[0]) + "\n" + '{"step": 2, "lo')
    res = _collect(Spawned([0]), tmp_path, 16, None, {0: 0})
    assert res.steps_done == 1


def test_ranks_ended_by_a_forwarded_stop_before_their_first_step_count_as_stopped(tmp_path):
    res = _collect(Spawned([-15, -15], signalled=True), tmp_path, 16, None, {})
    assert res.status == "stopped" and res.exit_code == 4
