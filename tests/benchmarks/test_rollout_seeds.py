"""benchmarks/rollout_seeds.py refuses an unknown case by name, before simulating anything."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import rollout_seeds  # noqa: E402


def test_an_unknown_case_exits_2_naming_it_and_the_choices(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        rollout_seeds.main(["--out", str(tmp_path), "--cases", "a100x640"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--cases: a100x640 unknown" in err and "a100x64+l4x64" in err
    assert not (tmp_path / "rollout_seeds.csv").exists()


def test_first_seed_runs_the_seeds_from_it(tmp_path):
    import copy
    import csv

    from benchmarks.rollout import CASES
    from qsync_opt.rollout.simulate import Simulator
    from qsync_opt.rollout.spec import load_rollout_spec

    assert rollout_seeds.main(["--out", str(tmp_path), "--cases", "a100x64", "--first-seed", "2", "--seeds", "1",
                               "--sim-steps", "1"]) == 0
    lines = [ln for ln in (tmp_path / "rollout_seeds.csv").read_text().splitlines() if not ln.startswith("#")]
    rows = list(csv.DictReader(lines))
    assert [int(r["seed"]) for r in rows] == [2]
    d = copy.deepcopy(dict(CASES)["a100x64"])
    d["rollout"]["steps"] = 1
    direct = Simulator(load_rollout_spec(d), "repack-best-fit", seed=2).run().trajectories_per_s
    assert float(rows[0]["best_fit_tps"]) == pytest.approx(direct, abs=1e-3)
