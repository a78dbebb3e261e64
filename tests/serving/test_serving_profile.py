"""Measured serving costs (serving/profile.py): each distinct (layer shape, bits, micro-batch, phase) is timed once,
the table is cached per machine and reused, the planner prices present devices by it, and a device that is not
here stays on the roofline with the plan saying so."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from qsync_opt.errors import SpecError
from qsync_opt.serving import profile as P
from qsync_opt.serving.planner import plan_serving
from qsync_opt.serving.spec import load_serving_spec
from qsync_opt.solver.budget import Budget

MODEL = {"layers": 4, "hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "vocab": 256, "max_positions": 64,
         "ffn_matrices": 3, "tied_embeddings": False}


def job(groups=None, costs="auto", bits=(4, 16), layers=4, quality=None, rel_gap=None, **serving):
    groups = groups or [{"name": "cpu", "device": "cpu-local"}]
    doc = {"kind": "serving", "name": "t", "cluster": {"groups": groups, "interconnect": "loopback"},
           "serving": {"model": {**MODEL, "layers": layers}, "prompt_len": 8, "gen_tokens": 4, "global_batch": 2,
                       "bits": list(bits), "micro_batches": {"prefill": [1, 2], "decode": [1, 2]},
                       "runtime_overhead_gb": 0.1, "costs": costs,
                       "quality": quality or {"max_indicator": None, "theta": 0.0}, **serving},
           "solver": {"time_limit_s": 30, **({"rel_gap": rel_gap} if rel_gap is not None else {})}}
    return load_serving_spec(doc)


class Counting:
    """An in-process runner whose timer runs each call once (the real forward) and counts the keys it timed."""

    def __init__(self, ms=1.0):
        self.timed, self.requests, self.ms = Counter(), [], ms

    def __call__(self, req):
        self.requests.append(req)

        def timer(key, fn):
            fn()
            self.timed[key] += 1
            return self.ms

        return P.measure(req, timer)


def test_each_distinct_key_is_measured_once_and_depth_is_not_part_of_the_key(tmp_path):
    path = tmp_path / "serving.json"
    groups = [{"name": "a", "device": "cpu-local"}, {"name": "b", "device": "cpu-local"},
              {"name": "c", "device": "cpu-sse41", "env": {"ONEDNN_MAX_CPU_ISA": "SSE41"}}]
    j = job(groups)
    run = Counting()
    P.profile_job(j, path=path, runner=run, log=lambda m: None)
    # 2 sizes x 2 phases x (2 bits + the head + 5 stage calls: first and last at 1 and 2 layers, the middle
    # at 2; the 1-layer middle stage is the 16-bit layer entry) = 32 keys, for two tables (a and b share
    # device, env and threads: one table), each key timed exactly once
    want = set(P.wanted(j))
    assert len(want) == 32
    assert len(run.requests) == 2
    assert all(Counter(r["keys"]) == Counter(want) for r in run.requests)
    assert run.timed == Counter({k: 2 for k in want})
    # an 8-layer model of the same layer shape reuses every entry: nothing is measured again
    again = Counting()
    costs, notes = P.measured_costs(job(groups, costs="measured", layers=8), path=path, runner=again)
    assert set(costs) == {"a", "b", "c"} and again.requests == [] and notes == []
    # another layer shape is another table
    other = job(groups, costs="measured", layers=4, **{"runtime": {"group_size": 32}})
    P.measured_costs(other, path=path, runner=again, log=lambda m: None)
    assert len(again.requests) == 2


def test_a_second_call_is_a_cache_hit_and_the_figures_are_the_cached_ones(tmp_path):
    path = tmp_path / "serving.json"
    j = job(costs="measured")
    first, _ = P.measured_costs(j, path=path, runner=Counting(ms=2.5), log=lambda m: None)

    def refuse(req):
        raise AssertionError(f"measured again: {req['keys']}")

    second, _ = P.measured_costs(j, path=path, runner=refuse)
    assert second == first
    # every entry cached at 2.5 ms: every stage call, whatever its depth, takes 2.5 ms, so the fit gives each
    # position a fixed 2.5 ms and a layer (almost) nothing
    assert set(second["cpu"].fixed.values()) == {2.5}
    assert all(v == pytest.approx(0.025) for v in second["cpu"].prefill.values())
    raw_entries = next(iter(json.loads(path.read_text())["tables"].values()))["entries"]
    assert set(raw_entries.values()) == {2.5}
    raw = json.loads(path.read_text())
    assert raw["format"] == P.FORMAT and len(raw["tables"]) == 1
    key = next(iter(raw["tables"]))
    assert "cpu-local" in key and "float32" in key and "torch=" in key


def fake(ms: dict[int, float]) -> P.GroupCosts:
    return P.GroupCosts(prefill={(b, m): ms[b] * m for b in ms for m in (1, 2)},
                        decode={(b, m): ms[b] * m / 2 for b in ms for m in (1, 2)},
                        head={(ph, m): 0.05 * m for ph in ("prefill", "decode") for m in (1, 2)})


def test_the_planner_prices_a_present_device_by_the_table():
    """The table decides the bits where the roofline decided otherwise, and every stage time is the table's:
    head + the sum of its layers' entries."""
    roof = plan_serving(job(costs="roofline"), Budget(30))
    # the catalog's cpu-local roofline: decode reads fewer weight bytes at 4 bits, so with no quality term 4 wins
    assert [b for st in roof.stages for b in st.bits] == [4] * 4 and roof.stages[0].cost_source == "roofline"
    for table, want in ((fake({4: 1.0, 16: 0.01}), 16), (fake({4: 0.01, 16: 1.0}), 4)):
        plan = plan_serving(job(), Budget(30), measured={"cpu": table})
        assert [b for st in plan.stages for b in st.bits] == [want] * 4
        st, mp, md = plan.stages[0], plan.prefill_micro_batch, plan.decode_micro_batch
        assert st.cost_source == "measured" and plan.cost_source.startswith("measured per layer for cpu")
        assert st.prefill_ms == pytest.approx(table.head[("prefill", mp)] + 4 * table.prefill[(want, mp)], rel=1e-12)
        assert st.decode_ms == pytest.approx(table.head[("decode", md)] + 4 * table.decode[(want, md)], rel=1e-12)


def test_a_slower_lower_bit_is_never_chosen_when_memory_allows_the_faster_higher_one():
    """By construction: with θ > 0, a bit-width that is slower in both phases and has a larger ω than another
    that fits is strictly worse for every layer, so an optimal plan (rel_gap 0) holds none of it. (With θ = 0 it
    could tie on a stage that is not the bottleneck; that is not claimed.)"""
    j = job(bits=(4, 8, 16), quality={"max_indicator": None, "theta": 1e-3}, rel_gap=0.0)
    table = fake({4: 0.9, 8: 0.2, 16: 0.5})  # 4-bit slower than 8-bit in both phases
    plan = plan_serving(j, Budget(30), measured={"cpu": table})
    assert plan.solver.status == "optimal"
    bits = [b for st in plan.stages for b in st.bits]
    assert 4 not in bits and bits == [8] * 4


def test_a_device_not_here_stays_roofline_and_the_plan_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path))
    groups = [{"name": "cpu", "device": "cpu-local"}, {"name": "t4", "device": "T4"}]
    j = job(groups, orderable=False)
    plan = plan_serving(j, Budget(30))  # auto, empty cache: every stage on the roofline, saying why
    assert [s.cost_source for s in plan.stages] == ["roofline", "roofline"]
    assert any("t4 (T4): roofline (device not on this machine)" in n for n in plan.notes)
    assert any("costs of cpu: roofline (no measured table" in n for n in plan.notes)
    P.profile_job(j, runner=Counting(), log=lambda m: None)  # measures the CPU group only
    plan = plan_serving(j, Budget(30))
    assert {s.device: s.cost_source for s in plan.stages} == {"cpu[0]": "measured", "t4[0]": "roofline"}
    assert "roofline for t4" in plan.cost_source
    with pytest.raises(SpecError, match=r"serving.costs: measured, but cluster.groups.1 \(t4, device T4\)"):
        plan_serving(job(groups, costs="measured"), Budget(30))


def test_a_corrupt_cache_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "serving.json"
    path.write_text("{not json")
    with pytest.raises(SpecError, match=str(path)):
        P.measured_costs(job(), path=path)


def test_a_folder_given_as_the_profile_file_is_named_as_a_folder_not_to_be_deleted(tmp_path):
    with pytest.raises(SpecError) as e:
        P.load(tmp_path)
    assert f"{tmp_path}: a folder, not a profile file; give a file in it" in str(e.value)
    assert "delete" not in str(e.value)
    with pytest.raises(SpecError, match="a folder, not a profile file"):
        P.profile_job(job(), path=tmp_path, runner=lambda req: {}, measure_link=lambda sizes: {})
    assert not tmp_path.with_name(tmp_path.name + ".lock").exists()  # refused before the lock beside it


def test_the_measuring_subprocess_times_real_calls_under_the_groups_env(monkeypatch):
    monkeypatch.setenv("QSYNC_OPT_SERVING_PROFILE_CAP", "8")
    g = job([{"name": "c", "device": "cpu-sse41", "env": {"ONEDNN_MAX_CPU_ISA": "SSE41", "OMP_NUM_THREADS": "1"}}])
    keys = [P.entry_key("layer", "prefill", 2, 8, 4), P.entry_key("layer", "decode", 1, P.decode_context(g), 16),
            P.entry_key("head", "decode", 1, P.decode_context(g))]
    group = g.cluster.groups[0]
    out = P.run_subprocess(P.request(g, group, keys))
    assert set(out) == set(keys) and all(v > 0 for v in out.values())


def clock_of(durations_ms):
    """A clock under which the k-th timed call lasts durations_ms[k] (each call reads the clock twice)."""
    reads, t = [], 0.0
    for d in durations_ms:
        reads += [t, t + d / 1e3]
        t += d / 1e3 + 1.0
    it = iter(reads)
    return lambda: next(it)


def test_stable_median_stops_at_the_floor_when_steady_and_at_the_cap_when_not():
    calls = []
    ms = P.stable_median_ms(lambda: calls.append(1), clock=clock_of([2.0] * 100), floor=5, cap=50, budget_ms=1e9)
    assert ms == pytest.approx(2.0) and len(calls) == 2 + 5  # two warm-ups, then the floor: the median never moved
    calls.clear()  # alternating 1 and 3 ms: the median swings between 1, 2 and 3 and never settles within 2%
    ms = P.stable_median_ms(lambda: calls.append(1), clock=clock_of([1.0, 3.0] * 50), floor=5, cap=12, budget_ms=1e9)
    assert len(calls) == 2 + 12 and ms == pytest.approx(2.0)


def test_qsync_opt_profile_takes_a_serving_spec(tmp_path, monkeypatch, capsys):
    from qsync_opt.cli.commands import main

    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps(job().model_dump(mode="json", by_alias=True)))
    run = Counting(ms=0.5)
    monkeypatch.setattr(P, "run_subprocess", run)
    out = tmp_path / "serving.json"
    assert main(["profile", str(spec), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "prefill measured" in text and "decode roofline" in text and str(out) in text.replace("\n", "")
    assert len(run.requests) == 1 and set(P.load(out).entries(P.table_key(job(), job().cluster.groups[0]))) == set(
        P.wanted(job()))
