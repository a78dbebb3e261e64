"""Bad rollout specs fail with a SpecError naming the field (and the CLI maps SpecError to exit 2)."""

from __future__ import annotations

import pytest
from rollout_cases import job_dict

from qsync_opt.errors import SpecError
from qsync_opt.rollout.spec import load_rollout_spec


def test_good_spec_loads():
    job = load_rollout_spec(job_dict())
    assert job.rollout.workload.batch == 32
    assert job.rollout.policy.staleness_bound == 1


def test_yaml_example_loads():
    job = load_rollout_spec("examples/rollout_laminar.yaml")
    assert job.rollout.workload.response.sigma == pytest.approx(0.9898, abs=1e-3)  # p99/median = 10


@pytest.mark.parametrize("content, needle", [
    ("300\n-5\n200\n", r"entry 2 is '-5'"),
    ("300\nlots\n", r"entry 2 is 'lots', not a number"),
    ("12.5\n", r"positive integers"),
], ids=["negative", "text", "fraction"])
def test_lengths_file_bad(tmp_path, content, needle):
    f = tmp_path / "lengths.txt"
    f.write_text(content)
    with pytest.raises(SpecError, match=r"rollout\.workload\.response") as e:
        load_rollout_spec(job_dict(**{"rollout.workload.response": {"file": str(f)}}))
    assert needle.replace("\\", "") in str(e.value).replace("\\", "") or pytest.fail(str(e.value))


def test_lengths_file_good(tmp_path):
    f = tmp_path / "lengths.txt"
    f.write_text("100 200\n4000\n")
    job = load_rollout_spec(job_dict(**{"rollout.workload.response": {"file": str(f)}}))
    assert job.rollout.workload.response.observed() == [100, 200, 4000]


def test_model_fits_no_worker():
    d = job_dict(**{"rollout.model": {"preset": "llama-3-70b", "max_positions": 32768}})
    with pytest.raises(SpecError, match=r"rollout\.workers\.0\.bits.*leaves KV room"):
        load_rollout_spec(d)


@pytest.mark.parametrize("value", [0, -0.1, 1.5])
def test_kv_threshold_range(value):
    with pytest.raises(SpecError, match=r"rollout\.repack\.kv_threshold"):
        load_rollout_spec(job_dict(**{"rollout.repack.kv_threshold": value}))


@pytest.mark.parametrize("kind", ["sync", "one-step-off"])
def test_staleness_bound_refused_for_barrier_policies(kind):
    with pytest.raises(SpecError, match=r"rollout\.policy.*eta: policy '" + kind + "' has a fixed staleness"):
        load_rollout_spec(job_dict(**{"rollout.policy": {"kind": kind, "eta": 2}}))


def test_unknown_field_and_group():
    with pytest.raises(SpecError, match=r"rollout\.workload\.prompt_per_step.*did you mean 'prompts_per_step'"):
        d = job_dict()
        d["rollout"]["workload"]["prompt_per_step"] = 3
        load_rollout_spec(d)
    with pytest.raises(SpecError, match=r"rollout\.workers\.0\.group: 'h100' is not a cluster group"):
        load_rollout_spec(job_dict(**{"rollout.workers": [{"group": "h100"}]}))


def test_repack_needs_trajectory_async():
    with pytest.raises(SpecError, match=r"rollout\.repack\.method: 'best-fit' needs policy kind trajectory-async"):
        load_rollout_spec(job_dict(**{"rollout.policy": {"kind": "stale"}, "rollout.repack.method": "best-fit"}))


def test_yaml_line_named(tmp_path):
    text = open("examples/rollout_laminar.yaml").read().replace("kv_threshold: 0.9", "kv_threshold: 1.2")
    with pytest.raises(SpecError, match=r"rollout\.repack\.kv_threshold \(line \d+\)"):
        load_rollout_spec(text)


def test_cut_frac_is_the_share_the_simulator_ends_at_max_len(tmp_path):
    """cut_frac(cap) against the simulator's own draw (sim_workload.sample_lengths, 200,000 lengths): within 0.005."""
    import numpy as np

    from qsync_opt.rollout.sim_workload import sample_lengths

    for over in ({"median": 300, "p99": 3000}, {"median": 300, "p99": 600}):
        dist = load_rollout_spec(job_dict(**{"rollout.workload.response": over})).rollout.workload.response
        for cap in (100, 300, 1000, 3000):
            drawn = sample_lengths(dist, 200_000, np.random.RandomState(0), cap)
            above = float(np.mean(sample_lengths(dist, 200_000, np.random.RandomState(0), 10**9) > cap))  # the same, uncut
            assert dist.cut_frac(cap) == pytest.approx(above, abs=0.005), (over, cap)
            assert float(np.mean(drawn == cap)) >= above  # those cut end exactly at cap
    f = tmp_path / "lengths.txt"
    f.write_text("10\n20\n30\n40\n")
    dist = load_rollout_spec(job_dict(**{"rollout.workload.response": {"file": str(f)}})).rollout.workload.response
    assert [dist.cut_frac(c) for c in (5, 10, 25, 40)] == [1.0, 0.75, 0.5, 0.0]
    fixed = load_rollout_spec(job_dict(**{"rollout.workload.response": {"median": 300}})).rollout.workload.response
    assert (fixed.cut_frac(299), fixed.cut_frac(300)) == (1.0, 0.0)


def test_plan_notes_a_max_len_that_cuts_more_than_the_tail():
    """max_len under the median: the plan says how many responses it cuts and names the field; at the default
    example (max_len past the p99) it says nothing."""
    from qsync_opt.rollout.plan import plan_from
    from qsync_opt.rollout.simulate import simulate

    def notes(**over):
        job = load_rollout_spec(job_dict(**over))
        return [n for n in plan_from(job, {"sync": simulate(job, "sync")}).notes if "max_len" in n]

    assert notes() == []  # p99 3000 under max_len 4000: 0.4% cut
    (note,) = notes(**{"rollout.workload.max_len": 200})
    assert note.startswith("rollout.workload.max_len 200 cuts 65.9% of the responses (median 300, p99 3000)")


def test_capped_mean_is_the_mean_of_the_simulators_draw():
    """LengthDist.mean(cap) against the simulator's own draw (sim_workload.sample_lengths: rounded to whole tokens,
    clipped to [1, cap]), 10^6 lengths at seed 0: within 4 standard errors (plus the rounding gap, far below them);
    and against the draw's exact mean (a finite sum over whole tokens) within `rounding_gap()`. The old
    min(cap, uncapped mean) lay above it wherever the cap cuts the tail (unless the 1-token floor lifts more)."""
    import math

    import numpy as np

    from qsync_opt.rollout.sim_workload import sample_lengths

    cases = [({"median": 1000, "p99": 10000}, 16384), ({"median": 1000, "p99": 10000}, 2000),
             ({"median": 300, "p99": 3000}, 1000), ({"median": 24, "p99": 240}, 320), ({"median": 3, "p99": 30}, 50)]
    for over, cap in cases:
        dist = load_rollout_spec(job_dict(**{"rollout.workload.response": over})).rollout.workload.response
        got = dist.mean(cap)
        x = sample_lengths(dist, 1_000_000, np.random.RandomState(0), cap)
        se = float(x.std()) / math.sqrt(len(x))
        assert abs(float(x.mean()) - got) <= 4 * se + dist.rounding_gap(), (over, cap, got, float(x.mean()), se)
        mu, s = math.log(dist.median), dist.sigma
        exact = 1 + sum(0.5 * math.erfc((math.log(k + 0.5) - mu) / s / math.sqrt(2)) for k in range(1, cap))
        assert abs(got - exact) <= dist.rounding_gap(), (over, cap, got, exact)
        if dist.median >= 24:  # the old form, high by 1-47% on these (at median 3 the floor of 1 token lifts the mean)
            assert got < min(cap, dist.median * math.exp(s * s / 2))
    fixed = load_rollout_spec(job_dict(**{"rollout.workload.response": {"median": 300}})).rollout.workload.response
    assert (fixed.mean(200), fixed.mean(1000)) == (200.0, 300.0)
