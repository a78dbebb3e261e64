"""The measured stage-to-stage hop (serving/link.py): real gloo messages between two local processes, cached
beside the per-layer costs, and what the planner prices a local CPU pipeline's hops with."""

from __future__ import annotations

import pytest
from test_serving_profile import Counting, job

from qsync_opt.serving import link
from qsync_opt.serving import profile as P
from qsync_opt.serving.instance import build
from qsync_opt.serving.planner import expand


def test_two_processes_bounce_each_size_and_report_one_hop_in_ms(monkeypatch):
    monkeypatch.setenv("QSYNC_OPT_LINK_ROUNDS", "5")
    got = link.measure([64, 4096])
    assert set(got) == {link.entry(64), link.entry(4096)}
    assert all(0 < v < 10_000 for v in got.values())


def test_the_hops_are_measured_once_cached_and_priced_by_the_planner(tmp_path):
    j = job(costs="measured")
    calls = []

    def fake_link(sizes):
        calls.append(list(sizes))
        return {link.entry(n): 0.5 + n / 1e6 for n in sizes}

    path = tmp_path / "p.json"
    P.profile_job(j, path=path, runner=Counting(), log=lambda m: None, measure_link=fake_link)
    P.profile_job(j, path=path, runner=Counting(), log=lambda m: None, measure_link=fake_link)
    assert len(calls) == 1 and sorted(calls[0]) == sorted(set(P.hop_bytes(j).values()))
    hops = P.measured_hops(j, path)
    assert hops == {k: 0.5 + n / 1e6 for k, n in P.hop_bytes(j).items()}
    inst = build(j.serving, expand(j), 2, 1, [{4: 1.0, 16: 0.0}] * 4, (5.0, 20.0), None, None, hops)
    assert inst.comm_pre_ms == hops[("prefill", 2)] and inst.comm_dec_ms == hops[("decode", 1)]


@pytest.mark.parametrize("groups, costs", [
    ([{"name": "g", "device": "T4"}], "auto"),   # a GPU pipeline: its hops are not local gloo messages
    (None, "roofline"),                          # roofline reads no measurement
])
def test_no_measured_hops_where_the_pipeline_is_not_local_or_costs_are_roofline(tmp_path, groups, costs):
    j = job(groups=groups, costs=costs)
    assert P.measured_hops(j, tmp_path / "none.json") is None
