"""The simulator's repack decisions are bounded by work, not by a clock: a state of more than
sim_repack.SIM_FULL_LIMIT trajectory × worker pairs goes to the aggregate form (SIM_ROUNDS rounds), a smaller one to
the full form (that the simulation stays deterministic: test_rollout_simulate's every-variant test); and the repack method is chosen by value: the plan recommends the program over best-fit only
beyond a tie wider than every resolution band the project measured."""

from __future__ import annotations

import csv
from pathlib import Path

from rollout_cases import job_dict

from qsync_opt.rollout import sim_repack
from qsync_opt.rollout.simulate import Simulator
from qsync_opt.rollout.spec import load_rollout_spec

ROOT = Path(__file__).resolve().parents[2]


def _decisions(monkeypatch, limit: int) -> list[tuple[int, str | None]]:
    """(pairs, form) of every program decision of the tiny job with the full form's limit at `limit`."""
    seen = []
    real = sim_repack.repack

    def spy(state, **kw):
        res = real(state, **kw)
        seen.append((len(state.trajectories) * len(state.workers), res.form))
        return res

    monkeypatch.setattr(sim_repack, "repack", spy)
    monkeypatch.setattr(sim_repack, "SIM_FULL_LIMIT", limit)
    job = load_rollout_spec(job_dict(**{"rollout.repack.method": "program"}))
    assert Simulator(job, "repack-program").run().repack_clock_stops == 0  # no plan depended on the clock
    return [(n, f) for n, f in seen if f != "none"]  # "none": no trajectory to place


def test_states_past_the_full_limit_go_to_the_aggregate_form(monkeypatch):
    default = _decisions(monkeypatch, sim_repack.SIM_FULL_LIMIT)
    assert default, "the tiny job repacks"
    limit = sorted(n for n, _ in default)[len(default) // 2]  # about half the decisions on each side
    low = _decisions(monkeypatch, limit)
    assert {f for n, f in low if n <= limit} == {"full"}
    assert {f for n, f in low if n > limit} == {"aggregate"}


def test_the_tie_is_wider_than_every_measured_band():
    """plan.recommend takes the program over best-fit only when it is more than TIE_FRAC faster; that tie must be wider
    than the widest band one method spans against itself (benchmarks/results/rollout_resolution.csv: a run's repack
    tick moved by up to 2%), so the program is recommended only where it measurably beats best-fit."""
    from qsync_opt.rollout.plan import TIE_FRAC, recommend

    rows = [r for r in csv.DictReader(ln for ln in (ROOT / "benchmarks/results/rollout_resolution.csv").open()
                                      if not ln.startswith("#"))]
    runs: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        runs.setdefault((r["case"], r["seed"], r["method"]), []).append(float(r["vs_base_pct"]))
    widest = max(max(v) - min(v) for v in runs.values()) / 100
    assert 0 < widest < TIE_FRAC

    class Fig:
        def __init__(self, variant, tps):
            self.variant, self.trajectories_per_s, self.staleness_mean, self.staleness_max = variant, tps, 1.0, 2

    inside = [Fig("repack-best-fit", 100.0), Fig("repack-program", 100.0 * (1 + widest))]
    assert recommend(inside)[0] == "repack-best-fit"
    beyond = [Fig("repack-best-fit", 100.0), Fig("repack-program", 100.0 / (1 - TIE_FRAC) * 1.001)]
    assert recommend(beyond)[0] == "repack-program"
