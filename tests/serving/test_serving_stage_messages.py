"""A local pipeline's hops are work of the stages they join (program.StageData.msg_*_ms, instance.stage_messages_ms):
the bottleneck stage serves m micro-batches of compute plus messages, the ring counts each hop once, the program's
optimum stays the brute-force one, and with per-micro-batch messages priced, one large decode micro-batch can beat
two small ones that the overlap-only model preferred."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from serving_cases import random_instance

from qsync_opt.serving.bounds import brute_force, lower_bound
from qsync_opt.serving.instance import stage_messages_ms
from qsync_opt.serving.program import Assignment, ServingInstance, StageData, evaluate, solve_serving
from qsync_opt.solver.backends.base import SolveOptions

OPTS = SolveOptions(time_limit_s=60, rel_gap=1e-7, threads=1)


def with_messages(inst: ServingInstance, seed: int) -> ServingInstance:
    r = random.Random(seed)
    stages = tuple(replace(st, msg_pre_ms=r.uniform(0.0, 0.6), msg_dec_ms=r.uniform(0.0, 0.3)) for st in inst.stages)
    return replace(inst, stages=stages)


@pytest.mark.parametrize("seed", range(6), ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("identical", [False, True], ids=["per-layer", "aggregated"])
@pytest.mark.parametrize("serial", [False, True], ids=["overlapped", "serial"])
def test_the_program_with_message_terms_matches_brute_force(seed, identical, serial):
    """With each hop's work on both its stages, micro-batches overlapped or (`serial`) not."""
    inst = replace(with_messages(random_instance(seed, layers=4 + seed % 3, stages=3, identical=identical), seed),
                   serial=serial)
    best, best_obj = brute_force(inst)
    res = solve_serving(inst, "highs", OPTS)
    if best is None:
        assert res.status == "infeasible"
        return
    assert res.status == "optimal"
    assert abs(res.objective - best_obj) <= 1e-6 * max(1.0, abs(best_obj)), (res.objective, best_obj)
    assert lower_bound(inst) <= best_obj + 1e-9  # messages only add time: the bound stays a bound


def test_stage_messages_charge_each_hop_to_both_its_ends():
    hops = {("prefill", 4): 0.3, ("decode", 2): 0.1}
    assert stage_messages_ms(3, hops, 4, 2) == pytest.approx({
        ("prefill", 0): 0.3, ("prefill", 1): 0.6, ("prefill", 2): 0.3 + 0.1,
        ("decode", 0): 0.2, ("decode", 1): 0.2, ("decode", 2): 0.2})
    assert stage_messages_ms(1, hops, 4, 2) == {("prefill", 0): 0.0, ("decode", 0): 0.0}


def two_stage(d_ms: float, m_dec: int, c: float, messages: bool) -> ServingInstance:
    """Two identical 1-layer stages of decode time d_ms per micro-batch, hop c, batch 8 in m_dec micro-batches."""
    st = StageData(name="s", device="cpu", pre_ms={16: 1.0}, dec_ms={16: d_ms}, mem_bytes={16: 1.0},
                   msg_dec_ms=2 * c if messages else 0.0)
    return ServingInstance(stages=(st, replace(st, name="t")), bits=(16,), omega=({16: 0.0}, {16: 0.0}),
                           m_dec=m_dec, decode_rounds=15, comm_dec_ms=c)


def test_priced_messages_make_one_large_micro_batch_win_where_overlap_alone_chose_two():
    """Decode per stage call 0.55 ms at 4 sequences, 0.6 at 8 (this size is overhead-bound), hop 0.1 ms.
    Overlap only: two micro-batches of 4 (max(2·0.55, 1.1 + 0.2) = 1.3 ms a step) beat one of 8 (1.2 + 0.2 = 1.4).
    With each hop's work on both its stages: two of 4 cost 2·(0.55 + 0.2) = 1.5 ms a step, one of 8 still 1.4."""
    a = Assignment(sizes=(1, 1), bits=(16, 16))
    for messages, two_wins in ((False, True), (True, False)):
        two = evaluate(two_stage(0.55, 2, 0.1, messages), a).decode_ms / 15
        one = evaluate(two_stage(0.60, 1, 0.1, messages), a).decode_ms / 15
        assert one == pytest.approx(1.4)
        assert two == pytest.approx(1.5 if messages else 1.3)
        assert (two < one) is two_wins


def test_serial_micro_batches_each_go_round_the_ring_alone():
    """Serial (no overlap): two micro-batches of 4 cost 2·(0.55 + 0.55 + 2·0.1) = 2.6 ms a decode step against
    1.4 for one of 8; prefill is m_p passes of the whole pipeline."""
    a = Assignment(sizes=(1, 1), bits=(16, 16))
    two = replace(two_stage(0.55, 2, 0.1, True), serial=True, m_pre=2, comm_pre_ms=0.5)
    ev = evaluate(two, a)
    assert ev.decode_ms / 15 == pytest.approx(2.6)
    assert ev.prefill_ms == pytest.approx(2 * (1.0 + 1.0 + 0.5 + 0.1))  # comm_p of one boundary + the tokens back
    assert evaluate(replace(two_stage(0.60, 1, 0.1, True), serial=True), a).decode_ms / 15 == pytest.approx(1.4)


def test_a_local_pipeline_is_serial_when_its_stage_threads_fill_the_cpus(monkeypatch):
    from qsync_opt.serving import profile as P
    from qsync_opt.serving.spec import load_serving_spec

    def job(threads, costs="measured"):
        groups = [{"name": n, "device": "cpu-local", "env": {"OMP_NUM_THREADS": str(threads)}} for n in ("a", "b")]
        return load_serving_spec({
            "kind": "serving", "name": "s", "cluster": {"groups": groups, "interconnect": "loopback"},
            "serving": {"model": {"layers": 2, "hidden": 64, "ffn": 128, "heads": 4, "kv_heads": 2, "vocab": 256,
                                  "max_positions": 64, "ffn_matrices": 3, "tied_embeddings": False},
                        "prompt_len": 8, "gen_tokens": 4, "global_batch": 2, "bits": [16], "costs": costs}})

    monkeypatch.setattr(P.os, "cpu_count", lambda: 4)
    assert P.stage_threads(job(2)) == [2, 2] and P.serial_pipeline(job(2))
    assert not P.serial_pipeline(job(1))  # 2 of 4 CPUs: a core is left for the messages
    assert not P.serial_pipeline(job(2, costs="roofline"))  # the roofline prices a wire, never this machine
