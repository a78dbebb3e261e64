"""`kind: loading`: the plan is the data plane's own split, measured against its lower bound and an even split;
`run` serves every sample of every global batch to exactly one rank; bad input is exit 2 naming the field."""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from qsync_opt import jobs
from qsync_opt.cli.commands import main
from qsync_opt.errors import SpecError
from qsync_opt.loading.engine import LocalEngine
from qsync_opt.loading.plan import LoadingPlan
from qsync_opt.solver.budget import Budget

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "loading_cpu_mix.yaml"
TOL = 1e-6
"""Relative slack between predicted seconds and the bound: the balancer quantises costs to 2**-20 of the largest."""


def small(**changes) -> dict:
    """A small loading spec: two sources, three ranks by speed on one curve."""
    doc = {
        "kind": "loading", "name": "small",
        "sources": [{"name": "short", "builtin": "synthetic-lm", "weight": 3,
                     "kwargs": {"num_samples": 300, "median": 64, "seed": 1}},
                    {"name": "long", "builtin": "synthetic-lm",
                     "kwargs": {"num_samples": 100, "median": 400, "seed": 2}}],
        "cost": {"c0": 1e-4, "a": 5e-6, "b": 1e-9},
        "ranks": [{"name": "fast", "speed": 1.0}, {"name": "mid", "speed": 0.5}, {"name": "slow", "speed": 0.25}],
        "global_batch": 16, "steps": 4,
    }
    doc.update(changes)
    return doc


def plane_steps(job, speeds, steps: int):
    """The data plane's step plans for `job`, opened as a trainer would (LocalEngine), independently of the plan."""
    engine = LocalEngine(job.mix(), global_batch=job.global_batch, speeds=speeds, cost=job.plane_cost(),
                         backend=job.balancer.backend)
    return [engine.next_batch() for _ in range(steps)]


@pytest.mark.parametrize("source", ["small", "example"])
def test_the_plan_is_the_data_planes_split(source):
    job = jobs.load_spec(small() if source == "small" else EXAMPLE)
    plan = jobs.solve(job)
    assert len(plan.split) == job.planned_steps
    given = [s.step for s in plan.split]
    assert given == list(range(job.planned_steps))
    for st, sp in zip(plan.split, plane_steps(job, [r.speed for r in plan.ranks], job.planned_steps)):
        if st.time_limited or sp.detail.get("time_limited"):
            continue  # a stage the wall clock stopped may split differently on a rerun (DataPlane's contract)
        for r, rs in enumerate(st.ranks):
            slots = sp.rank_slots(r)
            assert rs.samples == len(slots)
            assert rs.tokens == sum(sp.lengths[i] for i in slots)
            assert rs.predicted_s == pytest.approx(sp.predicted[r], rel=1e-12)
        assert st.makespan_s == pytest.approx(max(sp.predicted), rel=1e-12)
        assert (st.status, st.method) == (sp.status, sp.method)


def test_the_split_is_never_slower_than_an_even_one_nor_faster_than_the_bound():
    plan = jobs.solve(EXAMPLE)
    for st in plan.split:
        assert st.makespan_s <= st.even_s * (1 + TOL)
        assert st.makespan_s >= st.bound_s * (1 - TOL)
        assert st.even_s == pytest.approx(max(st.even_ranks_s))
    s = plan.summary
    assert s.steps == len(plan.split) and s.speedup >= 1.0 and 0.0 <= s.gap < 1.0
    assert sum(r.samples for r in plan.split[0].ranks) == plan.global_batch


def test_a_proven_optimal_split_is_optimal_over_every_assignment():
    """Seven samples over three ranks: 3**7 assignments, the best of them the balancer's 'optimal' split."""
    doc = small(global_batch=7, steps=3, balancer={"policy": "attention", "backend": "cpsat", "min_gain_ms": 0})
    job = jobs.load_spec(doc)
    plan = jobs.solve(job)
    costs = job.rank_costs()
    for st, sp in zip(plan.split, plane_steps(job, [r.speed for r in plan.ranks], 3)):
        assert st.status == "optimal"
        best = min(max(sum(costs[r](sp.lengths[i]) for i in range(7) if own[i] == r) for r in range(3))
                   for own in itertools.product(range(3), repeat=7))
        assert st.makespan_s == pytest.approx(best, rel=TOL)
        assert st.bound_s <= best * (1 + TOL)


def test_ranks_may_each_give_their_own_cost_curve():
    doc = small(ranks=[{"name": "a", "speed": 1.0}, {"name": "t4", "cost": {"a": 2e-5, "b": 4e-9}}])
    plan = jobs.solve(doc)
    t4 = plan.ranks[1]
    assert (t4.a, t4.b, t4.c0) == (2e-5, 4e-9, 0.0) and 0 < t4.speed < 1
    assert plan.ranks[0].speed == 1.0
    assert plan.summary.speedup >= 1.0


@pytest.mark.parametrize("rank, named", [
    ({"name": "mid", "speed": -1}, "ranks.1.speed"),
    ({"name": "mid", "sped": 0.5}, "ranks.1.sped"),
    ({"name": "mid"}, "ranks.1"),
    ({"name": "mid", "speed": 0.5, "device": "T5"}, "ranks.1.device"),
    ({"name": "fast", "speed": 0.5}, "ranks.1.name"),
])
def test_a_bad_rank_field_is_exit_2_naming_it(tmp_path, capsys, rank, named):
    doc = small()
    doc["ranks"][1] = rank
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["solve", str(spec)]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_a_rank_by_speed_needs_the_shared_curve(tmp_path, capsys):
    doc = small()
    del doc["cost"]
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["solve", str(spec)]) == 2
    assert "ranks.0.speed" in capsys.readouterr().err


def test_a_bound_the_plan_misses_is_reported_and_strict_exits_5(tmp_path, capsys):
    assert jobs.solve(small()).meets_bounds is None
    assert jobs.solve(small(max_step_ms=1e6)).meets_bounds is True
    spec = tmp_path / "tight.yaml"
    spec.write_text(yaml.safe_dump(small(max_step_ms=0.001), sort_keys=False))
    assert main(["solve", str(spec), "--strict"]) == 5
    assert "meets_bounds: false" in capsys.readouterr().err


def test_the_report_round_trips(tmp_path):
    plan = jobs.solve(small())
    for name in ("plan.json", "plan.yaml"):
        path = plan.save(tmp_path / name)
        kind, back = jobs.load_plan(path)
        assert kind is jobs.KINDS["loading"] and back == plan
        assert json.loads(back.to_json()) == json.loads(plan.to_json())

    def printed(p: LoadingPlan) -> str:
        buf = io.StringIO()
        kind.report(p, Console(file=buf, width=200, color_system=None))
        return buf.getvalue()

    assert printed(back) == printed(plan)
    assert "predicted step time" in printed(plan) and "fast" in printed(plan)


def test_a_loading_plan_given_as_a_spec_is_refused(tmp_path, capsys):
    path = jobs.solve(small()).save(tmp_path / "plan.json")
    assert main(["solve", str(path)]) == 2
    assert "is a loading plan written by `qsync-opt solve`, not a spec" in capsys.readouterr().err


def test_run_serves_every_sample_of_each_global_batch_to_exactly_one_rank(tmp_path):
    spec = tmp_path / "small.yaml"
    spec.write_text(yaml.safe_dump(small(horizon=2), sort_keys=False))
    paths = jobs.run(spec, tmp_path / "out", steps=5)
    assert set(paths) == {"plan", "served", "report"}
    assert all(Path(p).is_file() for p in paths.values())
    job = jobs.load_spec(spec)
    plan = LoadingPlan.load(paths["plan"])
    assert len(plan.split) == 2  # the horizon
    rows = list(csv.DictReader(open(paths["served"])))
    assert len(rows) == 5 * len(job.ranks)
    for sp in plane_steps(job, [r.speed for r in plan.ranks], 5):
        mine = [r for r in rows if int(r["step"]) == sp.step]
        ids = Counter(i for r in mine for i in r["ids"].split())
        assert ids == Counter(f"{s}:{i}" for s, i in sp.samples)
        assert sum(ids.values()) == job.global_batch
        assert sum(int(r["tokens"]) for r in mine) == sp.global_tokens
    report = Path(paths["report"]).read_text()
    assert "predicted step time" in report and "## served" in report


def test_run_leaves_no_half_written_artefact_when_a_source_lies(tmp_path, capsys):
    """A source whose samples are not as long as its lengths say: exit 2 naming its lengths, no served.csv."""
    (tmp_path / "liar.py").write_text(
        "class Liar:\n"
        "    lengths = [5] * 40\n"
        "    def __len__(self):\n        return 40\n"
        "    def __getitem__(self, i):\n        return [0] * 3\n"
        "def make():\n    return Liar()\n")
    doc = small(sources=[{"name": "liar", "import": "liar:make", "lengths": "from_source"}])
    spec = tmp_path / "liar.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "out"
    assert main(["run", str(spec), "-o", str(out), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "sources.0.lengths: sample" in err and "holds 3 tokens, its lengths say 5" in err
    assert "Traceback" not in err
    assert (out / "plan.json").is_file()
    assert not (out / "served.csv").exists() and not (out / "report.md").exists()
    assert [p.name for p in out.iterdir()] == ["plan.json"]  # no temporary file left either


def test_run_refuses_steps_below_one(tmp_path):
    spec = tmp_path / "small.yaml"
    spec.write_text(yaml.safe_dump(small(), sort_keys=False))
    with pytest.raises(SpecError, match="--steps 0"):
        jobs.run(spec, tmp_path / "out", steps=0)


@pytest.mark.slow
def test_run_on_ray_serves_what_the_inprocess_run_serves(tmp_path, ray_local):
    """`engine: ray` (a loader actor per source, a coordinator actor) hands every rank the same samples."""
    served = {}
    for engine in ("inprocess", "ray"):
        spec = tmp_path / f"{engine}.yaml"
        doc = small(engine=engine, balancer={"backend": None})  # heuristic split: no solver import in the actor
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths = jobs.run(spec, tmp_path / engine, steps=3)
        rows = csv.DictReader(open(paths["served"]))
        served[engine] = [{k: v for k, v in row.items() if k not in ("read_s", "plan_s", "wait_s")} for row in rows]
    assert served["ray"] == served["inprocess"]


def test_every_step_draws_its_time_limit_from_the_plans_budget():
    k = jobs.KINDS["loading"]
    job = jobs.load_spec(small(balancer={"time_limit_ms": 500}))
    budget = k.budget(job)
    assert budget.limit_s == pytest.approx(job.planned_steps * 0.5)
    plan = k.plan(job, budget)
    assert [label for label, _, _ in budget.grants] == [f"balance step {t}" for t in range(job.planned_steps)]
    assert all(given <= left for _, given, left in budget.grants)
    spent = k.plan(job, Budget(0.0))  # nothing left: the deterministic heuristics alone, every step still split
    assert len(spent.split) == len(plan.split)
    assert all(s.makespan_s <= s.even_s * (1 + TOL) for s in spent.split)


def test_a_batch_no_split_fits_is_infeasible_naming_the_loading_field(tmp_path, capsys):
    spec = tmp_path / "capped.yaml"
    spec.write_text(yaml.safe_dump(small(balancer={"token_cap": 100}), sort_keys=False))
    assert main(["solve", str(spec)]) == 3
    err = capsys.readouterr().err
    assert "step 0: balance:" in err and "balancer.token_cap" in err and "data.token_cap" not in err


def test_a_stop_while_serving_is_exit_4_and_leaves_the_plan_alone(tmp_path, capsys):
    """SIGINT while the ranks read (sent by a source on its 40th read): exit 4, plan.json whole, no served.csv."""
    (tmp_path / "stopper.py").write_text(
        "import os, signal\n"
        "class Stopper:\n"
        "    lengths = [8] * 400\n"
        "    reads = 0\n"
        "    def __len__(self):\n        return 400\n"
        "    def __getitem__(self, i):\n"
        "        Stopper.reads += 1\n"
        "        if Stopper.reads == 40:\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return [0] * 8\n"
        "def make():\n    return Stopper()\n")
    doc = small(sources=[{"name": "stopper", "import": "stopper:make", "lengths": "from_source"}], horizon=1)
    spec = tmp_path / "stop.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "out"
    assert main(["run", str(spec), "-o", str(out), "--steps", "40"]) == 4
    assert "Traceback" not in capsys.readouterr().err
    assert LoadingPlan.load(out / "plan.json").summary.steps == 1
    assert sorted(p.name for p in out.iterdir()) == ["plan.json"]


def test_run_with_prefetch_serves_the_same_samples_and_reports_plan_and_wait(tmp_path):
    """`balancer.prefetch`: step t+1 is planned while step t is served; the samples and split are those of the inline
    run, and served.csv carries each step's plan_s and wait_s (the same on every rank's row of the step)."""
    served = {}
    for prefetch in (False, True):
        spec = tmp_path / f"p{prefetch}.yaml"
        spec.write_text(yaml.safe_dump(small(balancer={"prefetch": prefetch}), sort_keys=False))
        paths = jobs.run(spec, tmp_path / f"out{prefetch}", steps=4)
        rows = list(csv.DictReader(open(paths["served"])))
        for _, group in itertools.groupby(rows, key=lambda r: r["step"]):
            group = list(group)
            assert len({(r["plan_s"], r["wait_s"]) for r in group}) == 1
            assert float(group[0]["plan_s"]) > 0 and float(group[0]["wait_s"]) >= 0
        served[prefetch] = [(r["step"], r["rank"], r["ids"]) for r in rows]
        report = Path(paths["report"]).read_text()
        assert ("prefetched while the previous step runs" if prefetch else "planning per step (inline)") in report
    assert served[True] == served[False]
