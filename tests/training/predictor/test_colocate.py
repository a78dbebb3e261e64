"""Co-located profiling: one process per local rank, parts merged without losing entries,
finished processes stay busy until every profiler is done. No timing is asserted."""

from __future__ import annotations

from qsync_opt.training.predictor.colocate import keep_busy, merge_parts, rank_jobs
from qsync_opt.training.predictor.profile import Profile, load_profile, section_key
from qsync_opt.training.spec import load_spec

SPEC = """
cluster:
  groups:
    - {name: a, device: cpu-local, count: 2}
    - {name: b, device: cpu-sse41, env: {ONEDNN_MAX_CPU_ISA: SSE41}}
model: {name: tiny-cnn}
training: {global_batch: 24, optimizer: adam}
"""


def test_one_process_per_local_rank_profilers_first_in_rank_order():
    spec = load_spec(SPEC)
    a, b = spec.cluster.groups
    jobs = rank_jobs([a, b], [a, b])
    assert [(g.name, prof) for g, prof in jobs] == [("a", True), ("a", False), ("b", True)]
    # b's section is already measured: it only keeps its core busy while a is profiled
    assert [(g.name, prof) for g, prof in rank_jobs([a, b], [a])] == [("a", True), ("a", False), ("b", False)]


def test_merging_parts_keeps_each_profilers_own_section_only(tmp_path):
    path = tmp_path / "p.json"
    base = Profile.new()
    base.section({}, 1).ops["old"] = {"fwd_ms": 1.0, "bwd_ms": 1.0}
    base.save(path)
    ka, kb = section_key({}, 1), section_key({"ONEDNN_MAX_CPU_ISA": "SSE41"}, 1)
    parts = []
    for name, key, env in (("a", ka, {}), ("b", kb, {"ONEDNN_MAX_CPU_ISA": "SSE41"})):
        part = load_profile(path)  # each process starts from the same copy ...
        part.section(env, 1).ops[f"new-{name}"] = {"fwd_ms": 2.0, "bwd_ms": 2.0}  # ... and adds its own
        part.save(tmp_path / f"p.json.{name}.part")
        parts.append((tmp_path / f"p.json.{name}.part", key))
    merge_parts(path, parts)
    merged = load_profile(path)
    assert set(merged.sections[ka].ops) == {"old", "new-a"}
    assert set(merged.sections[kb].ops) == {"new-b"}
    assert not list(tmp_path.glob("*.part"))


def test_a_finished_profiler_keeps_stepping_until_every_peer_is_done(tmp_path):
    calls = []

    def step():  # the other profiler finishes during this process's third busy step
        calls.append(1)
        if len(calls) == 3:
            (tmp_path / "b.done").touch()

    keep_busy(step, tmp_path, 2, done_name="a")
    assert len(calls) == 3 and (tmp_path / "a.done").exists()
    keep_busy(step, tmp_path, 2, done_name=None)  # a companion: peers already done, no step
    assert len(calls) == 3


def test_one_failing_process_stops_the_others_instead_of_leaving_them_busy():
    import subprocess
    import sys

    from qsync_opt.training.predictor.colocate import wait_all

    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    failing = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
    assert wait_all([("a", busy), ("b", failing)], poll_s=0.05) == [("b", 2)]
    assert busy.poll() is not None  # stopped, not left running for a minute
    ok = [("c", subprocess.Popen([sys.executable, "-c", "pass"]))]
    assert wait_all(ok, poll_s=0.05) == []
