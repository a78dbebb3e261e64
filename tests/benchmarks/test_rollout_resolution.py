"""benchmarks/rollout_resolution.py: the band a method spans against itself, and what it calls a gain, a tie, a loss."""

from __future__ import annotations

import copy
import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import rollout_resolution as rr  # noqa: E402
from benchmarks.rollout import CASES  # noqa: E402
from qsync_opt.rollout.simulate import Simulator  # noqa: E402
from qsync_opt.rollout.spec import load_rollout_spec  # noqa: E402


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(ln for ln in path.read_text().splitlines() if not ln.startswith("#")))


def test_a_margin_is_a_gain_or_a_loss_only_outside_the_band():
    assert rr.classify(0.30, 0.25) == "gain"
    assert rr.classify(-0.30, 0.25) == "loss"
    assert rr.classify(0.25, 0.25) == "tie"  # on the edge: the method moves this far against itself
    assert rr.classify(-0.25, 0.25) == "tie"
    assert rr.classify(0.0, 0.0) == "tie"
    assert rr.spread_pct([99.0, 100.0, 101.5], 100.0) == pytest.approx(2.5)


def test_the_base_run_is_the_case_unchanged_and_the_others_shift_the_tick(tmp_path, capsys):
    (tmp_path / "rollout_seeds.csv").write_text(
        "# command: test\ncase,seed,steps,best_fit_tps,program_tps,program_vs_best_fit_pct,program_solver_ms_max\n"
        "a100x64,0,2,1,1,+5.00,1\n")
    assert rr.main(["--out", str(tmp_path), "--cases", "a100x64", "--seeds", "1", "--sim-steps", "2"]) == 0
    rows = _rows(tmp_path / "rollout_resolution.csv")
    assert [float(r["interval_s"]) for r in rows] == [1.96, 1.98, 2.0, 2.02, 2.04]
    base = next(r for r in rows if float(r["interval_s"]) == 2.0)
    assert float(base["vs_base_pct"]) == 0.0
    d = copy.deepcopy(dict(CASES)["a100x64"])
    d["rollout"]["steps"] = 2
    direct = Simulator(load_rollout_spec(d), "repack-best-fit", seed=0).run().trajectories_per_s
    assert float(base["trajectories_per_s"]) == pytest.approx(direct, abs=1e-3)
    out = capsys.readouterr().out
    # a +5% margin is far outside the band of a 2% tick shift on two steps: the seeds file's margin is read and judged
    assert "program − best-fit +5.00: gains 1, ties 0, losses 0" in out


def test_an_unknown_case_exits_2_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        rr.main(["--out", str(tmp_path), "--cases", "a100x640"])
    assert e.value.code == 2
    assert "--cases: a100x640 unknown" in capsys.readouterr().err
    assert not (tmp_path / "rollout_resolution.csv").exists()
