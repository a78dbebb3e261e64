"""Shadow loaders: a source loader that dies (raises in process; its Ray actor killed with kill -9) or
stalls past the deadline is taken over by its standby, and the consumer's loop gets exactly the samples
of an undisturbed run, step by step: none lost, none repeated, the loop goes on. Without a standby the
same failure ends the run with an error naming the source."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import yaml

from qsync_opt.cli.commands import main
from qsync_opt.data.config import DataSpec
from qsync_opt.loading.engine import open_engine
from qsync_opt.loading.sources import SourceReadError

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]

SOURCES = [
    {"name": "short", "builtin": "synthetic-lm", "kwargs": {"num_samples": 300, "median": 32, "max_len": 128}, "weight": 3},
    {"name": "long", "builtin": "synthetic-lm",
     "kwargs": {"num_samples": 80, "median": 400, "min_len": 100, "max_len": 900, "seed": 1}},
]
STEPS, BATCH, SPEEDS = 8, 8, [1.0, 0.5]
KW = {"global_batch": BATCH, "speeds": SPEEDS, "backend": None}  # heuristic split: no solver import in a Ray actor


def data(**kw) -> DataSpec:
    return DataSpec(sources=SOURCES, balance="attention", **kw)


def consume(engine, steps=STEPS, between=None) -> list:
    """The training loop's view: per step, per rank, the ids it was handed and the tokens it read."""
    out = []
    for t in range(steps):
        if between is not None:
            between(t)
        plan = engine.next_batch()
        ranks = []
        for r in range(len(SPEEDS)):
            ids = plan.rank_ids(r)
            ranks.append((ids, [x.tolist() for x in engine.read(ids, plan.step)]))
        out.append((plan.step, ranks))
    return out


@pytest.fixture(scope="module")
def undisturbed():
    eng = open_engine(data(), **KW)
    try:
        return consume(eng)
    finally:
        eng.close()


class Dies:
    """A loader's dataset that raises from its `after`-th read on (a crashed reader)."""

    def __init__(self, inner, after: int):
        self.inner, self.left = inner, after

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        self.left -= 1
        if self.left < 0:
            raise RuntimeError("reader process crashed")
        return self.inner[i]


class Stalls(Dies):
    """A loader's dataset that blocks from its `after`-th read on, until `release` is set."""

    release = threading.Event()

    def __getitem__(self, i):
        self.left -= 1
        if self.left < 0:
            self.release.wait(60)
        return self.inner[i]


def sabotage(engine, s: int, fault) -> None:
    src = engine.supervisor.primary[s]
    src.dataset = fault(src.dataset)


def assert_same(got, ref):
    assert [step for step, _ in got] == list(range(STEPS))
    for (t, ranks), (_, want) in zip(got, ref):
        assert ranks == want, f"step {t} differs from the undisturbed run"
    ids = [x for _, ranks in got for r in ranks for x in r[0]]
    assert len(ids) == STEPS * BATCH  # every slot served once


def test_in_process_loader_that_raises_mid_step_is_taken_over(undisturbed):
    eng = open_engine(data(shadow=True), **KW)
    try:
        sabotage(eng, 0, lambda ds: Dies(ds, after=3 * BATCH))  # dies within step 3 or 4 (source 0 gives ~3/4)
        got = consume(eng)
        assert_same(got, undisturbed)
        (tk,) = eng.takeovers
        assert tk.source == "short" and tk.reason.startswith("died") and "crashed" in tk.reason
        assert 3 <= tk.step < STEPS and tk.seconds >= 0
        assert tk.resumed_from is not None and tk.resumed_from <= tk.step
    finally:
        eng.close()


def test_in_process_loader_that_stalls_past_the_deadline_is_taken_over(undisturbed):
    Stalls.release.clear()
    eng = open_engine(data(shadow=True, stall_timeout_s=0.5), **KW)
    try:
        sabotage(eng, 1, lambda ds: Stalls(ds, after=2))
        got = consume(eng)
        assert_same(got, undisturbed)
        (tk,) = eng.takeovers
        assert tk.source == "long" and tk.reason.startswith("stalled") and "0.5" in tk.reason
    finally:
        Stalls.release.set()
        eng.close()


def test_the_standby_restores_its_position_from_the_full_plus_delta_record(undisturbed):
    """With a full state every 3 steps the record of a late step is a delta; the takeover resolves it against
    its full state (checksum checked) and still serves exactly the step's samples."""
    eng = open_engine(data(shadow=True, checkpoint_full_every=4), **KW)
    try:
        sabotage(eng, 0, lambda ds: Dies(ds, after=5 * BATCH))
        assert_same(consume(eng), undisturbed)
        (tk,) = eng.takeovers
        assert tk.step % 4 != 0  # a delta record: the full state is the last multiple of 4's
        assert tk.resumed_from == tk.step - tk.step % 4
    finally:
        eng.close()


def test_without_a_standby_a_dead_or_stalled_loader_ends_the_run_naming_the_source():
    eng = open_engine(data(), **KW)
    sabotage_local = eng.sources[0]
    sabotage_local.dataset = Dies(sabotage_local.dataset, after=BATCH)
    with pytest.raises(SourceReadError, match="data source 'short' raised RuntimeError reading sample"):
        consume(eng)
    Stalls.release.clear()
    eng = open_engine(data(stall_timeout_s=0.3), **KW)
    try:
        sabotage(eng, 1, lambda ds: Stalls(ds, after=1))
        t0 = time.perf_counter()
        with pytest.raises(SourceReadError, match=r"'long': its loader stalled: no answer within 0.3 s.*"
                                                  r"no standby; set data.shadow: true"):
            consume(eng)
        assert time.perf_counter() - t0 < 30  # the deadline ended it, not the stuck read
    finally:
        Stalls.release.set()
        eng.close()


def test_a_sample_the_standby_cannot_read_either_is_the_sources_error():
    class Broken(Dies):
        def __getitem__(self, i):
            raise OSError("bad sector")

    eng = open_engine(data(shadow=True), **KW)
    try:
        sabotage(eng, 0, lambda ds: Broken(ds, 0))
        eng.supervisor.standby[0].result().dataset = Broken(None, 0)  # the standby reads the same bad disk
        with pytest.raises(SourceReadError, match="'short': its loader died.*and its standby died.*source itself"):
            consume(eng, steps=1)
    finally:
        eng.close()


@pytest.mark.parametrize("data_keys, field", [
    ({"stall_timeout_s": 0}, "data.stall_timeout_s"), ({"stall_timeout_s": float("inf")}, "data.stall_timeout_s"),
    ({"shadow": "maybe"}, "data.shadow"), ({"prefetch": "often"}, "data.prefetch"),
])
def test_training_spec_checks_the_new_data_keys_naming_the_field(data_keys, field):
    from qsync_opt.errors import SpecError
    from qsync_opt.training.spec import load_spec

    doc = yaml.safe_load((ROOT / "examples" / "cpu_tiny.yaml").read_text())
    doc["data"] = {"sources": SOURCES, **data_keys}
    with pytest.raises(SpecError, match=field):
        load_spec(doc)


def test_the_new_data_keys_need_sources():
    from qsync_opt.errors import SpecError
    from qsync_opt.training.spec import load_spec

    doc = yaml.safe_load((ROOT / "examples" / "cpu_tiny.yaml").read_text())
    doc["data"] = {**doc.get("data", {}), "shadow": True}
    doc["data"].pop("sources", None)
    with pytest.raises(SpecError, match="data.shadow applies to the data plane's sources.*data.sources"):
        load_spec(doc)


def loading_spec(tmp_path, **changes) -> str:
    doc = {"kind": "loading", "name": "shadowed", "sources": SOURCES, "cost": {"c0": 1e-4, "a": 5e-6, "b": 1e-9},
           "ranks": [{"name": "fast", "speed": 1.0}, {"name": "slow", "speed": 0.5}],
           "global_batch": BATCH, "steps": 4, "balancer": {"backend": None}}
    doc.update(changes)
    path = tmp_path / f"spec{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


@pytest.mark.parametrize("changes, field", [({"stall_timeout_s": -1}, "stall_timeout_s"),
                                            ({"stall_timeout_s": ".inf"}, "stall_timeout_s"),
                                            ({"shadow": "maybe"}, "shadow"),
                                            ({"balancer": {"prefetch": 3}}, "balancer.prefetch")])
def test_loading_spec_checks_them_naming_the_field(tmp_path, capsys, changes, field):
    if changes.get("stall_timeout_s") == ".inf":
        changes = {"stall_timeout_s": float("inf")}
    assert main(["solve", loading_spec(tmp_path, **changes), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


CRASHING = """
from qsync_opt.loading.sources import SyntheticLM
READS = [0]
class Crashing(SyntheticLM):
    # the instance that makes the 20th read of this module's samples crashes for good; other instances
    # (a standby opened later) read on
    dead = False
    def __getitem__(self, i):
        READS[0] += 1
        if READS[0] == 20:
            self.dead = True
        if self.dead:
            raise ConnectionError("worker lost")
        return super().__getitem__(i)
def make(**kw):
    return Crashing(**kw)
"""


def test_run_with_a_crashing_loader(tmp_path, capsys, monkeypatch):
    """`qsync-opt run`: with shadow the run serves the same samples as with a healthy source and its report lists
    the takeover; without, it ends with exit 1 and a one-line error naming the source."""
    import csv
    import importlib
    import sys

    (tmp_path / "crashing.py").write_text(CRASHING)
    monkeypatch.syspath_prepend(str(tmp_path))
    first = dict(SOURCES[0], builtin=None, **{"import": "crashing:make", "lengths": "from_source"})
    first.pop("builtin")
    crashing = [first, SOURCES[1]]
    served = {}
    for name, sources, extra in (("healthy", SOURCES, {}), ("shadowed", crashing, {"shadow": True}),
                                 ("alone", crashing, {})):
        sys.modules.pop("crashing", None)
        importlib.invalidate_caches()
        code = main(["run", loading_spec(tmp_path, sources=sources, **extra), "-o", str(tmp_path / name)])
        err = capsys.readouterr().err
        if name == "alone":
            assert code == 1 and "Traceback" not in err
            assert "data source 'short' raised ConnectionError reading sample" in err and "worker lost" in err
            continue
        assert code == 0, err
        with open(tmp_path / name / "served.csv") as f:
            rows = list(csv.DictReader(f))
        served[name] = [(r["step"], r["rank"], r["ids"]) for r in rows]
        if name == "shadowed":
            assert any(r["takeovers"].startswith("short:died:") for r in rows)
            report = (tmp_path / name / "report.md").read_text()
            assert "## standby takeovers" in report and "| short | died |" in report
    assert served["shadowed"] == served["healthy"]


@pytest.mark.slow
def test_ray_loader_killed_with_kill_9_or_stalled_is_taken_over(undisturbed, ray_local):
    """The Ray engine: source 0's loader actor process gets SIGKILL between steps 3 and 4 (mid-epoch: 300
    samples, ~6 a step), source 1's loader stalls at step 6; each standby actor takes over and the loop gets
    the undisturbed run's samples. Then the same kill without a standby ends the loop with an error naming
    the source."""
    eng = open_engine(data(engine="ray", shadow=True, stall_timeout_s=1.0), **KW)
    try:
        def kill(t):
            if t == 4:
                os.kill(ray_local.get(eng.loader(0).pid.remote()), signal.SIGKILL)
            if t == 6:  # source 1's loader stalls: a 60 s call queued ahead of its next read
                eng.loader(1).__ray_call__.remote(lambda self: time.sleep(60))

        assert_same(consume(eng, between=kill), undisturbed)
        died, stalled = eng.takeovers
        assert (died.source, died.step) == ("short", 4) and "actor is gone" in died.reason
        assert (stalled.source, stalled.step) == ("long", 6) and stalled.reason.startswith("stalled: no answer within 1 s")
    finally:
        eng.close()
    eng = open_engine(data(engine="ray"), **KW)
    try:
        os.kill(ray_local.get(eng.loader(1).pid.remote()), signal.SIGKILL)
        with pytest.raises(SourceReadError, match="data source 'long': its loader died: its Ray actor is gone.*"
                                                  "no standby; set data.shadow: true"):
            consume(eng)
    finally:
        eng.close()


def test_a_takeover_serves_only_what_the_recorded_state_draws_in_that_step():
    """The standby's position comes from the step's state record: a request that the record says the step does
    not hold (here step 0's samples claimed for step 5) is refused, not read."""
    eng = open_engine(data(shadow=True), **KW)
    try:
        plans = [eng.next_batch() for _ in range(6)]
        sabotage(eng, 0, lambda ds: Dies(ds, after=0))
        ids = [x for x in plans[0].samples if x[0] == 0]
        with pytest.raises(SourceReadError, match="'short': the standby was asked for samples the plane's "
                                                  "recorded state at step 5 does not draw"):
            eng.read(ids, step=5)
        healthy = open_engine(data(), **KW)
        assert [x.tolist() for x in eng.read(ids, step=0)] == [x.tolist() for x in healthy.read(ids)]
        assert [(t.step, t.source) for t in eng.takeovers] == [(0, "short")]
    finally:
        eng.close()


def test_a_takeover_after_a_resume_serves_the_resumed_sequence(undisturbed):
    """A shadowed engine resumed from another's state (a training checkpoint) places its takeovers by the steps it
    hands out from there."""
    first = open_engine(data(shadow=True), **KW)
    consume(first, steps=3)
    state = first.state_dict()
    first.close()
    eng = open_engine(data(shadow=True), **KW)
    try:
        eng.load_state_dict(state)
        sabotage(eng, 0, lambda ds: Dies(ds, after=BATCH))
        got = consume(eng, steps=STEPS - 3)
        assert [(t, ranks) for t, ranks in got] == undisturbed[3:]
        (tk,) = eng.takeovers
        assert tk.source == "short" and 3 <= tk.step < STEPS and tk.resumed_from >= 3
    finally:
        eng.close()
