"""benchmarks/predictor.py's verdicts (the issue's targets against the in-run noise floor) and
ddp_step_readings.py's refusal of a spec without a DDP step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import ddp_step_readings  # noqa: E402
import yaml  # noqa: E402
from predictor import spread_pct, verdict, window_noise_pct  # noqa: E402


def test_the_noise_floor_is_the_spread_of_the_fp32_windows_over_their_mean():
    assert spread_pct([10.0, 11.0, 12.0]) == pytest.approx(2 / 11 * 100)
    assert spread_pct([5.0, 5.0]) == 0.0


def test_single_process_needs_the_median_within_3_percent_or_noise_and_the_max_within_twice_that():
    assert verdict("single", [2.0, 2.5, 5.9], noise=1.0) == "median met, max met (limit 3.0%)"
    assert verdict("single", [2.0, 2.5, 6.1], noise=1.0) == "median met, max MISSED (limit 3.0%)"
    assert verdict("single", [3.5, 4.0, 6.1], noise=1.0).startswith("median MISSED")
    assert verdict("single", [9.0, 9.0, 19.0], noise=10.0) == "median met, max met (limit 10.0%)"


def test_ddp_needs_the_median_within_5_percent_or_noise():
    assert verdict("ddp", [4.0, 5.0, 30.0], noise=0.5) == "median met (limit 5.0%)"
    assert verdict("ddp", [6.0, 6.0, 6.0], noise=0.5) == "median MISSED (limit 5.0%)"
    assert verdict("ddp", [6.0, 6.0, 6.0], noise=7.0) == "median met (limit 7.0%)"


def test_window_noise_is_the_median_disagreement_of_one_plan_between_two_rounds():
    rounds = [{"a": 10.0, "b": 20.0}, {"a": 11.0, "b": 20.0}, {"a": 10.0, "b": 22.0}]
    # pairs (r0,r1), (r0,r2), (r1,r2) for a: 9.52, 0, 9.52; for b: 0, 9.52, 9.52 -> median 9.52
    assert window_noise_pct(rounds) == pytest.approx(1 / 10.5 * 100)
    assert window_noise_pct(rounds[:1] * 2) == 0.0


def test_ddp_step_readings_refuses_a_single_rank_spec_naming_it(tmp_path, capsys):
    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "cpu_tiny.yaml").read_text())
    raw["cluster"]["groups"] = raw["cluster"]["groups"][:1]
    spec = tmp_path / "one.yaml"
    spec.write_text(yaml.safe_dump(raw))
    with pytest.raises(SystemExit) as e:
        ddp_step_readings.main(["--out", str(tmp_path / "out"), "--spec", str(spec)])
    assert e.value.code == 2
    assert f"--spec {spec}: a single rank has no DDP step" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
