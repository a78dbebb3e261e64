"""Bad data-plane input: a clear SpecError naming the field and the fix (CLI exit 2), and
specs without the new keys validate and dump exactly as before."""

import importlib.util
from pathlib import Path

import pytest
import yaml

from qsync_opt.data.config import DataSpec
from qsync_opt.errors import SpecError
from qsync_opt.training.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "cpu_tiny.yaml"
SHORT = {"name": "short", "builtin": "synthetic-lm", "kwargs": {"num_samples": 50}}


def spec_with(data):
    d = yaml.safe_load(TINY.read_text())
    d["data"] = data
    return d


def error_of(data) -> str:
    with pytest.raises(SpecError) as e:
        load_spec(spec_with(data))
    return str(e.value)


def test_import_source_without_lengths():
    msg = error_of({"sources": [SHORT, {"name": "docs", "import": "pkg.mod:docs"}]})
    assert "data.sources.1" in msg and "lengths is required" in msg and "from_source" in msg


def test_all_zero_weights():
    msg = error_of({"sources": [dict(SHORT, weight=0), {"name": "b", "builtin": "synthetic-lm", "weight": 0.0}]})
    assert "data" in msg and "every weight is zero at step 0" in msg and "positive weight" in msg


def test_zero_weights_at_a_schedule_point():
    msg = error_of({"sources": [dict(SHORT, schedule=[[0, 1.0], [100, 0.0]]),
                                {"name": "b", "builtin": "synthetic-lm", "schedule": [[0, 0.0], [50, 0.0]]}]})
    assert "every weight is zero at step 100" in msg


def test_negative_weight():
    msg = error_of({"sources": [dict(SHORT, weight=-1)]})
    assert "data.sources.0.weight" in msg and ">= 0" in msg


def test_schedule_going_backwards():
    msg = error_of({"sources": [dict(SHORT, schedule=[[0, 1.0], [200, 2.0], [100, 1.0]])]})
    assert "data.sources.0.schedule" in msg and "step 100 follows step 200" in msg and "step order" in msg


def test_ray_engine_without_ray(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    msg = error_of({"sources": [SHORT], "engine": "ray"})
    assert "data.engine" in msg and "pip install" in msg and "inprocess" in msg


def test_cli_exits_2_naming_the_field(tmp_path, capsys):
    from qsync_opt.cli.commands import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec_with({"sources": [dict(SHORT, schedule=[[10, 1.0], [5, 1.0]])]})))
    assert main(["solve", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "data.sources.0.schedule" in err and "Traceback" not in err


def test_balance_without_sources():
    assert "need data.sources" in error_of({"balance": "attention"})


def test_old_data_sections_unchanged():
    d = DataSpec(name="mnist", eval_every=5)
    assert set(d.model_dump(by_alias=True)) == {"name", "import", "kwargs", "input_shape", "eval_every",
                                                 "eval_start", "eval_batch", "eval_groups"}
    assert d.balance_policy == "none" and d.engine == "inprocess"
    new = DataSpec(sources=[SHORT])
    assert new.balance_policy == "attention"
    assert DataSpec.model_validate(new.model_dump(by_alias=True)) == new


def test_source_reading_errors_name_the_source(tmp_path, monkeypatch):
    from qsync_opt.loading.sources import SourceReadError, open_source

    (tmp_path / "mysrc.py").write_text(
        "class DS:\n"
        "    lengths = [3, 4]\n"
        "    def __len__(self): return 2\n"
        "    def __getitem__(self, i):\n"
        "        if i == 1: raise IOError('disk gone')\n"
        "        return [1, 2, 3]\n"
        "def make(): return DS()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = DataSpec(sources=[{"name": "web", "import": "mysrc:make", "lengths": "from_source"}])
    src = open_source(spec.sources[0], 0)
    assert list(src.lengths) == [3, 4]
    with pytest.raises(SourceReadError, match="'web'.*sample 1.*disk gone"):
        src.get(1)
    bad = DataSpec(sources=[{"name": "web", "import": "mysrc:make", "lengths": [3]}])
    with pytest.raises(SpecError, match=r"data.sources.0.lengths: 1 lengths for a dataset of 2"):
        open_source(bad.sources[0], 0)
