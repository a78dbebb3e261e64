"""The dispatch table comes from measurement: the race picks the least measured time, the profile keeps one winner
per shape class, and the whole steps, the plan and the trainer all run that winner.

Timings are never asserted (machine load): the race is checked on scripted times, the profile on what it recorded.
"""

from __future__ import annotations

import pytest

from qsync_opt.errors import KernelBuildError, SpecError
from qsync_opt.kernels.dispatch import Target, kernel_choices
from qsync_opt.training.predictor import measuring, profiler, step_profile
from qsync_opt.training.predictor.measured_dispatch import SCREEN_RATIO, race, shape_class, winners
from qsync_opt.training.predictor.profile import load_profile
from qsync_opt.training.spec import load_spec


def test_race_takes_the_least_fwd_plus_bwd_of_the_screened():
    fwd = {"templated": 1.0, "torch": 1.2}
    full = {"templated": (1.0, 3.0), "torch": (1.2, 2.0)}  # quicker forward, slower backward: torch wins overall
    winner, times, rec = race(("templated", "torch"), fwd.__getitem__, full.__getitem__)
    assert (winner, times) == ("torch", (1.2, 2.0))
    assert rec["templated"]["fwd_ms"] == 1.0 and rec["torch"]["bwd_ms"] == 2.0


def test_the_screen_drops_a_candidate_whose_forward_is_far_slower():
    timed = []
    fwd = {"templated": 5.0 * SCREEN_RATIO, "torch": 5.0 - 1e-9}

    def full(k):
        timed.append(k)
        return {"templated": (0.1, 0.1), "torch": (5.0, 5.0)}[k]

    winner, _, rec = race(("templated", "torch"), fwd.__getitem__, full)
    assert winner == "torch" and timed == ["torch"]  # never timed in full, so its (scripted) quick full time is unseen
    assert rec["templated"] == {"screen_fwd_ms": fwd["templated"]}


def test_a_candidate_that_cannot_run_is_recorded_and_left_out():
    def fwd(k):
        if k == "templated":
            raise SpecError("impl='templated': not exact here")
        return 1.0

    winner, _, rec = race(("templated", "torch"), fwd, lambda k: (1.0, 1.0))
    assert winner == "torch" and "not exact" in rec["templated"]["error"]

    def none(k):
        raise KernelBuildError("no compiler")

    with pytest.raises(KernelBuildError, match="no compiler"):
        race(("templated", "torch"), none, lambda k: (1.0, 1.0))


def test_only_auto_races_and_only_formats_with_two_implementations():
    cpu = Target("cpu")
    assert kernel_choices(cpu, "int8") == ("templated", "torch")
    assert kernel_choices(cpu, "int4") == ("templated", "torch")
    assert kernel_choices(cpu, "int8", "torch") == ("torch",)  # pinned: the user's choice
    assert kernel_choices(cpu, "bf16") == ("auto",)
    assert kernel_choices(Target("cuda", 90), "fp8_e4m3") == ("templated", "torch")
    assert kernel_choices(Target("cuda", 70), "int8") == ("torch",)  # no templated int8 below sm_75


SPEC = """
cluster:
  groups: [{{name: here, device: cpu-local, precisions: [int8], env: {{OMP_NUM_THREADS: "1"}}, profile: {profile}}}]
model: {{name: tiny-cnn}}
training: {{global_batch: 2, optimizer: sgd}}
costs: measured
"""


@pytest.fixture
def profiled(tmp_path, monkeypatch):
    """(spec, section, the op_kernels each whole step ran with) of a profile of tiny-cnn at int8 only."""
    monkeypatch.setattr(measuring, "BLOCKS", 1)
    monkeypatch.setattr(measuring, "REPEATS", 1)
    ran = {}
    real = step_profile.make_step
    monkeypatch.setattr(step_profile, "make_step",
                        lambda spec, module, rank, gg, p, op_kernels=None, device=step_profile.CPU:
                        ran.setdefault(p, op_kernels) and None or real(spec, module, rank, gg, p, op_kernels, device))
    path = tmp_path / "p.json"
    spec = load_spec(SPEC.format(profile=path))
    sec = profiler.profile_group(spec, "here", path, progress=False)
    return spec, path, sec, ran


def _graph(spec):
    import torch

    from qsync_opt.models.from_spec import build_from_spec, input_maker
    from qsync_opt.models.tracing import trace

    torch.manual_seed(spec.training.seed)
    return trace(build_from_spec(spec), input_maker(spec)(1, torch.Generator().manual_seed(0)),
                 model_name="tiny-cnn").for_batch(2)


def test_the_profile_keeps_one_measured_winner_per_shape_class_and_the_steps_run_it(profiled):
    spec, path, sec, ran = profiled
    gg = _graph(spec)
    classes = {shape_class(n, "int8") for n in gg.selectable}
    assert set(sec.dispatch) == classes  # every class of this model's swapped ops was raced, once
    for cls, e in sec.dispatch.items():
        full = {k: c["fwd_ms"] + c["bwd_ms"] for k, c in e["candidates"].items() if "fwd_ms" in c}
        assert e["impl"] == min(full, key=full.get)
        assert set(e["candidates"]) == {"templated", "torch"}
        assert sec.ops[e["at"]]["fwd_ms"] == e["candidates"][e["impl"]]["fwd_ms"]  # the op entry is the winner's
    won = winners(sec.dispatch, gg, ("int8",))
    assert set(won) == {n.name for n in gg.selectable}
    assert ran["int8"] == {op: by_p["int8"] for op, by_p in won.items()}  # the whole step ran the winners
    assert load_profile(path).find_section({"OMP_NUM_THREADS": "1"}, 1).dispatch == sec.dispatch  # saved


def test_the_plan_names_the_winners_and_the_trainer_runs_them(profiled):
    spec, path, sec, _ = profiled
    from qsync_opt.jobs import solve
    from qsync_opt.runtime.qmodules import QuantizedModule
    from qsync_opt.training.runtime.trainer import build_rank_model

    plan = solve(spec)
    g = plan.groups["here"]
    by_name = {n.name: n for n in _graph(spec).selectable}
    # every op is at int8 (the only precision offered), and runs its class's winner
    assert g.kernels == {op: sec.dispatch[shape_class(by_name[op], "int8")]["impl"] for op in g.precisions}
    model = build_rank_model(spec, plan, "here")
    swapped = {n: m.recipe.kernels for n, m in model.named_modules() if isinstance(m, QuantizedModule)}
    assert swapped == dict(g.kernels)


def test_a_corrupt_dispatch_entry_names_the_field(profiled):
    import json

    from qsync_opt.training.predictor.profile import ProfileError

    _, path, _, _ = profiled
    raw = json.loads(path.read_text())
    sec = next(iter(raw["sections"].values()))
    next(iter(sec["dispatch"].values()))["impl"] = "fastest"
    path.write_text(json.dumps(raw))
    with pytest.raises(ProfileError, match="dispatch"):
        load_profile(path)


def test_a_signature_of_a_raced_class_is_timed_with_the_winner_alone(profiled, monkeypatch):
    """Drop every op entry but keep the dispatch: the rerun races nothing and times each signature once."""
    spec, path, sec, _ = profiled
    prof = load_profile(path)
    s = prof.find_section({"OMP_NUM_THREADS": "1"}, 1)
    n_ops = len(s.ops)
    s.ops.clear()
    prof.save(path)
    calls = []
    real = profiler.time_op
    monkeypatch.setattr(profiler, "time_op", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(profiler, "race", lambda *a, **k: pytest.fail("raced a class the profile already holds"))
    again = profiler.profile_group(spec, "here", path, progress=False)
    assert len(calls) == n_ops and again.dispatch == sec.dispatch


def test_a_pinned_kernels_setting_is_what_runs_whatever_the_profile_raced(profiled):
    """A profile raced under auto, then the spec pins kernels: the auto section's times (the winners') are not
    priced for the pin; the profiler times the pinned setting in a section of its own, and the plan names no
    winner, so the trainer runs the pin."""
    from qsync_opt.training.predictor.profile import ProfileError

    spec, path, sec, ran = profiled
    assert sec.dispatch  # raced under auto
    pinned = spec.model_copy(update={"runtime": spec.runtime.model_copy(update={"kernels": "torch"})})
    from qsync_opt.jobs import solve

    with pytest.raises(ProfileError, match="no section for env .* under runtime kernels=torch"):  # costs: measured
        solve(pinned)
    seen = []
    real_race = profiler.race
    monkey = pytest.MonkeyPatch()
    try:
        monkey.setattr(profiler, "race", lambda *a, **k: seen.append(1) or real_race(*a, **k))
        ran.clear()
        profiler.profile_group(pinned, "here", path, progress=False)
    finally:
        monkey.undo()
    prof = load_profile(path)
    own = prof.find_section({"OMP_NUM_THREADS": "1"}, 1, runtime="kernels=torch")
    assert own.ops and not own.dispatch and prof.find_section({"OMP_NUM_THREADS": "1"}, 1).dispatch == sec.dispatch
    assert solve(pinned).groups["here"].kernels == {}
    assert not seen and ran["int8"] == {}  # nothing raced, and the whole step ran the pin on every op
