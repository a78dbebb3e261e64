"""After a real run the recommendation follows the measurement (the calibrated simulator only where the measurement
does not separate two policies), says where simulation and measurement disagree, and report.md and the console say
the same; every column of both tables is defined under it. Constructed tables: no Ray."""

from __future__ import annotations

import io

from rich.console import Console

from qsync_opt.rollout.plan import (
    MEASURED_TIE_FRAC,
    CeilingFigures,
    PolicyFigures,
    RolloutPlan,
    recommend_measured,
    separated,
)
from qsync_opt.rollout.report import POLICY_LEGEND, print_plan
from qsync_opt.rollout.run_report import MEASURED_LEGEND, MeasuredSection, print_measured, report_markdown, with_measured
from qsync_opt.rollout.simulate import VARIANTS

# the run: the simulation (the spec's costs) puts partial-rollout first; measured here it is 5th of 7, and the
# simulator calibrated from the run puts it below trajectory-async
SIMULATED = {"sync": 278.52, "one-step-off": 283.27, "stale": 435.07, "partial-rollout": 1287.89,
             "trajectory-async": 1107.62, "repack-best-fit": 1107.62, "repack-program": 1107.62}
MEASURED = {"sync": 37.0, "one-step-off": 33.0, "stale": 61.0, "partial-rollout": 52.93, "trajectory-async": 70.0,
            "repack-best-fit": 90.38, "repack-program": 74.0}
CALIBRATED = {"sync": 31.0, "one-step-off": 35.9, "stale": 44.3, "partial-rollout": 48.1, "trajectory-async": 66.2,
              "repack-best-fit": 66.3, "repack-program": 66.3}


def test_a_real_run_recommends_the_fastest_measured_and_names_the_simulations_pick_it_contradicts():
    rec = recommend_measured(MEASURED, CALIBRATED, simulated=SIMULATED, simulated_pick="partial-rollout")
    assert rec.variant == "repack-best-fit"
    assert "measured 90.38 trajectories/s" in rec.reason
    assert rec.ranks["partial-rollout"] == (5, 4, 1)  # measured, calibrated, simulated
    first = rec.disagreements[0]
    assert "recommends partial-rollout" in first and "ranks 5 of 7" in first and "52.93" in first
    # a pair the measurement separates and the simulation orders the other way is named
    assert any(d.startswith("repack-best-fit measured 1.71x partial-rollout") and "the simulation predicts "
               "partial-rollout" in d for d in rec.disagreements)
    assert "1 round(s)" in rec.rule and f"{MEASURED_TIE_FRAC:.0%}" in rec.rule


def test_policies_the_measurement_does_not_separate_are_ranked_by_the_calibrated_simulator():
    measured = {"stale": 60.0, "trajectory-async": 57.0, "sync": 30.0}  # 5% apart: one round cannot order them
    assert not separated(measured, "stale", "trajectory-async") and separated(measured, "stale", "sync")
    rec = recommend_measured(measured, {"stale": 44.0, "trajectory-async": 66.0, "sync": 31.0})
    assert rec.variant == "trajectory-async" and "does not separate stale 60.00, trajectory-async 57.00" in rec.reason
    # the calibrated simulator ties them too (within 1%): the simpler policy
    rec = recommend_measured(measured, {"stale": 66.0, "trajectory-async": 66.2, "sync": 31.0})
    assert rec.variant == "stale" and "the simplest, stale" in rec.reason


def test_with_enough_rounds_the_sign_test_decides_what_is_separated():
    # 7 rounds: stale's median is 1.40x trajectory-async's, but it wins only 4 of 7 rounds: the sign test does not
    # separate them (one round's 15% rule would); against sync it wins all 7 (the interval excludes 1)
    rounds = {"stale": [80, 82, 50, 81, 49, 83, 48], "trajectory-async": [55, 58, 59, 54, 60, 52, 57],
              "sync": [30, 31, 29, 30, 28, 32, 30]}
    measured = {v: sorted(x)[3] for v, x in rounds.items()}
    assert separated(measured, "stale", "trajectory-async")  # by the one-round rule
    assert not separated(measured, "stale", "trajectory-async", rounds)
    assert separated(measured, "stale", "sync", rounds)
    rec = recommend_measured(measured, {"stale": 40.0, "trajectory-async": 60.0, "sync": 20.0}, rounds=rounds)
    assert rec.variant == "trajectory-async" and "7 rounds" in rec.rule and "sign-test" in rec.rule


def _plan() -> RolloutPlan:
    fig = dict(tokens_per_s=1000.0, rollout_idle_frac=0.1, rollout_sync_frac=0.0, rollout_migrate_frac=0.0,
               trainer_idle_frac=0.9, staleness_mean=0.9, staleness_max=7, kv_util_mean=0.01, repacks=0, moves=0,
               repack_overhead_s=0.0, solver_wall_ms_mean=0.0, solver_wall_ms_max=0.0, sim_time_s=1.0, steps=12)
    return RolloutPlan(name="cpu-tiny", model="custom-2x64", batch=16, recommended="partial-rollout",
                       reason="1287.89 trajectories/s", spec_policy="trajectory-async",
                       policies=[PolicyFigures(variant=v, trajectories_per_s=SIMULATED[v], **fig) for v in VARIANTS],
                       workers=[], broadcast_s=0.0, push_s=0.0, steps=12,
                       ceiling=CeilingFigures(trajectories_per_s=3679.0, trainer_tps=15776.0, rollout_tps=3679.0,
                                              bound_by="rollouts"))


def _section() -> MeasuredSection:
    rows = [{"policy": v, "real_trajectories_per_s": MEASURED[v], "predicted_trajectories_per_s": CALIBRATED[v],
             "predicted_vs_real": CALIBRATED[v] / MEASURED[v] - 1, "real_rollout_idle_frac": 0.4,
             "predicted_rollout_idle_frac": 0.4, "real_trainer_idle_frac": 0.5, "predicted_trainer_idle_frac": 0.5}
            for v in VARIANTS]
    return MeasuredSection(rows, {}, 1, 0.4, 3.3)


def test_report_and_console_recommend_the_same_policy_on_the_measured_evidence():
    plan, section = _plan(), _section()
    measured_plan = with_measured(plan, section)
    assert measured_plan.recommended == "repack-best-fit" and measured_plan.evidence == "measured here"
    assert measured_plan.simulated_recommended == "partial-rollout"
    report = report_markdown(measured_plan, ["sync", "partial-rollout"], section)
    assert "**Recommended: repack-best-fit** (measured here, 1 round(s)" in report
    assert "The simulation alone (the spec's costs, the table below) recommends partial-rollout" in report
    assert "Where simulation and measurement disagree:" in report and "ranks 5 of 7" in report
    buf = io.StringIO()
    print_measured(measured_plan, section, Console(file=buf, width=400))
    printed = buf.getvalue()
    assert f"recommended (measured here): repack-best-fit — {measured_plan.reason}" in printed
    assert f"**Recommended: repack-best-fit** (measured here, 1 round(s) on Ray actors; \"Measured here\" below): " \
           f"{measured_plan.reason}." in report
    for d in section.recommendation(measured_plan).disagreements:
        assert f"- {d}" in report and f"simulation and measurement disagree: {d}" in printed
    # the console's plan, printed before the real run, does not call the simulation's pick "recommended"
    buf = io.StringIO()
    print_plan(plan, Console(file=buf, width=400), real_pending=True)
    assert "the simulation recommends: partial-rollout" in buf.getvalue()
    assert "\nrecommended:" not in buf.getvalue()


def test_every_column_of_both_tables_is_defined_under_it_and_staleness_above_eta_explained():
    plan, section = _plan(), _section()
    report = report_markdown(with_measured(plan, section), ["sync"], section)
    for name, _ in MEASURED_LEGEND:
        assert f"\n- {name}: " in report, name
    assert "\n- off: predicted / measured - 1" in report
    for name, _ in POLICY_LEGEND[:-1]:  # solver ms is a console column only
        assert f"\n- {name}: " in report, name
    staleness = next(x for x in report.splitlines() if x.startswith("- staleness mean / max:"))
    assert "eta bounds admission" in staleness and "the max can exceed eta" in staleness
    buf = io.StringIO()
    print_plan(plan, Console(file=buf, width=400))
    printed = buf.getvalue()
    header = printed[:printed.index("sync  ")]  # every column the console prints is in the legend under it
    for name, _ in POLICY_LEGEND:
        assert f"{name}: " in printed, name
    for name in ("× sync", "of ceiling", "rollout idle", "trainer idle", "KV util", "repacks", "moves"):
        assert name in header, name
    for name, _ in POLICY_LEGEND[:-1]:  # the report's columns carry the legend's names
        assert f" {name} |" in report, name


def test_the_share_staler_than_eta_is_counted_and_stale_policy_drains_within_it():
    """eta bounds admission; a long response admitted within it is trained later: the plan counts how many."""
    from pathlib import Path

    from qsync_opt.jobs import load_spec
    from qsync_opt.rollout.simulate import simulate

    job = load_spec(str(Path(__file__).resolve().parents[2] / "examples" / "rollout_cpu_tiny.yaml"))
    eta = job.rollout.policy.eta
    ta = simulate(job, "trajectory-async", steps=6)
    assert ta.staleness_max > eta and 0 < ta.stale_over_eta_frac < 1
    assert simulate(job, "stale", steps=6).stale_over_eta_frac == 0  # each sync drains every trajectory first
    assert simulate(job, "sync", steps=6).stale_over_eta_frac is None


def test_write_measured_rewrites_plan_json_and_report_md_with_one_recommendation(tmp_path, monkeypatch):
    """The real run faked (no Ray): report.md, plan.json and the console agree, and a second real run into the same
    folder starts again from the simulation's own recommendation."""
    import json
    from pathlib import Path

    from qsync_opt.jobs import load_spec
    from qsync_opt.rollout import ray_run
    from qsync_opt.rollout.run_report import run_report, write_measured

    def fake(job, rounds, variants=None, seed=0, per_round=None):
        if per_round is not None:
            per_round.update({v: [MEASURED[v]] for v in VARIANTS})
        return _section().rows, "constructed"

    monkeypatch.setattr(ray_run, "measured_vs_predicted", fake)
    job = load_spec(str(Path(__file__).resolve().parents[2] / "examples" / "rollout_cpu_tiny.yaml"))
    plan, _ = run_report(job, tmp_path, steps=2)
    for _ in range(2):
        buf = io.StringIO()
        write_measured(job, tmp_path, 1, Console(file=buf, width=400))
        saved = json.loads((tmp_path / "plan.json").read_text())
        assert saved["recommended"] == "repack-best-fit" and saved["evidence"] == "measured here"
        assert saved["simulated_recommended"] == plan.recommended
        report = (tmp_path / "report.md").read_text()
        assert report.count("**Recommended:") == 1 and "**Recommended: repack-best-fit** (measured here" in report
        assert report.count("## Measured here") == 1
        assert f"recommended (measured here): repack-best-fit — {saved['reason']}" in buf.getvalue()
        assert f"{saved['reason']}." in report
