"""The CLI contract schedulers script against: exit codes, --json on stdout, no tracebacks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qsync_opt.cli import main
from qsync_opt.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "examples" / "cpu_tiny.yaml")


def run(*args):
    return subprocess.run([sys.executable, "-m", "qsync_opt.cli", *args], capture_output=True, text=True, timeout=300)


def test_json_goes_to_stdout_alone(tmp_path):
    out = tmp_path / "plan.yaml"
    r = run("solve", TINY, "--json", "-o", str(out))
    assert r.returncode == 0, r.stderr
    plan = Plan.model_validate(json.loads(r.stdout))
    assert plan == Plan.load(out)
    assert "ops per precision" in r.stderr


def test_bad_spec_exits_2_with_field_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(TINY).read_text().replace("count: 1", "count: 0", 1))
    r = run("solve", str(bad))
    assert r.returncode == 2
    assert "cluster.groups.0.count" in r.stderr and "Traceback" not in r.stderr


def test_infeasible_exits_3_with_diagnosis(tmp_path):
    bad = tmp_path / "tight.yaml"
    bad.write_text(Path(TINY).read_text().replace("count: 1\n    - name: noamx", "count: 1\n      memory_gb: 0.001\n    - name: noamx"))
    r = run("solve", str(bad))
    assert r.returncode == 3, r.stderr
    assert "amx: memory needs" in r.stderr


@pytest.mark.parametrize("fmt", ["json", "mps", "lp"])
def test_export_problem_and_resolve(tmp_path, fmt, capsys):
    path = tmp_path / f"p.{fmt}"
    assert main(["solve", TINY, "--export-problem", str(path), "--backend", "highs"]) == 0
    assert path.stat().st_size > 0
    if fmt == "json":
        assert main(["solve", "--problem", str(path), "--backend", "cbc"]) == 0
        assert "optimal" in capsys.readouterr().out


def test_devices_and_models_list(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "T4" in out and "H100-SXM" in out
    assert main(["models"]) == 0
    assert "resnet50" in capsys.readouterr().out


def test_bench_solvers_writes_table_csv_and_png(tmp_path, capsys):
    code = main(["bench", "solvers", "--models", "tiny-resnet", "--sizes", "12", "--backends", "highs,greedy",
                 "--limit", "10", "--out", str(tmp_path)])
    assert code == 0
    rows = [r for r in (tmp_path / "solvers.csv").read_text().splitlines() if not r.startswith("#")]  # header comments: command, load
    assert rows[0].startswith("case,family,size,backend,status,wall_s")
    assert len(rows) == 1 + (3 + 2) * 2  # (3 clusters + chain + dag) x 2 backends
    assert (tmp_path / "solvers.png").stat().st_size > 1000
    assert "solver benchmark" in capsys.readouterr().out
