"""benchmarks/rollout_streaming.py: the job it simulates streams its trainer, and a bad flag is named (the streaming
trainer itself: tests/rollout/test_rollout_trainer_streaming.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))

from rollout_cases import job_dict  # noqa: E402

from benchmarks import rollout_streaming as rs  # noqa: E402
from qsync_opt.rollout.simulate import Simulator  # noqa: E402
from qsync_opt.rollout.spec import load_rollout_spec  # noqa: E402


def test_the_streaming_job_is_the_job_with_its_trainer_streaming():
    job = load_rollout_spec(job_dict())
    s = rs.streaming(job, 4)
    assert s.rollout.trainer_micro_batches == 4 and job.rollout.trainer_micro_batches == 1
    assert s.model_dump(exclude={"rollout": {"trainer_micro_batches"}}) == \
        job.model_dump(exclude={"rollout": {"trainer_micro_batches"}})
    assert Simulator(s, "repack-best-fit").micro_batches == 4


@pytest.mark.parametrize("bad", ["nope:4", "h100x128", "h100x128:many"])
def test_a_bad_case_is_named_with_the_flag(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as e:
        rs.main(["--out", str(tmp_path), "--cases", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--cases" in err and repr(bad) in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_bad_micro_batch_count_is_named_with_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        rs.main(["--out", str(tmp_path), "--micro-batches", "0"])
    assert e.value.code == 2 and "--micro-batches 0" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
