"""`train` says where its metrics go, and by default keeps them in a named run folder or beside
the checkpoints, not in a random /tmp/qsync-run-* folder."""

from pathlib import Path

import pytest

from qsync_opt.cli import commands as cli
from qsync_opt.training.runtime import launch
ROOT = Path(__file__).resolve().parents[3]
TINY = str(ROOT / "examples" / "cpu_tiny.yaml")


@pytest.fixture
def captured(monkeypatch, tmp_path):
    seen = {}

    class Done(Exception):
        pass

    def run_job(spec, plan, **kw):  # the real one calls on_metrics_dir once the checks passed and the folder is made
        seen.update(kw)
        kw["on_metrics_dir"](Path(kw["metrics_dir"]))
        raise Done

    monkeypatch.setattr(launch, "run_job", run_job)
    monkeypatch.chdir(tmp_path)
    return seen, Done


@pytest.mark.parametrize("extra, where", [([], "qsync-runs/cpu-tiny-"), (["--checkpoint-dir", "ck"], "ck/metrics"),
                                          (["--metrics-dir", "m"], "m")], ids=["default", "checkpoints", "given"])
def test_metrics_folder_is_named_and_printed_at_start(captured, capsys, extra, where):
    seen, done = captured
    with pytest.raises(done):
        cli.main(["train", TINY, "--plan", "p.json", *extra])
    assert seen["metrics_dir"].startswith(where)
    assert f"metrics: {seen['metrics_dir']}" in capsys.readouterr().out
