"""Every example's plan is the recorded one: a restructuring must not change what the planner decides.

Each `golden_plans/<example>.json` holds the decision content of `qsync-opt solve examples/<example>.yaml
--json`, as solved by the tree named in its `recorded_with` (7f2e188, the tree before issue #41's
restructuring; an example added later was recorded from the tree that added it). This test solves the
example with the current tree through `qsync_opt.solve(path)` and compares:

- discrete choices (precisions, local batches, stages, layers, bits, micro-batches, the recommended
  policy, statuses, counts, strings): exactly;
- figures (predicted times, memory, indicators, objectives, simulated rates): relative 1e-9, a float
  summation order's worth. The discrete choices being equal, every figure is evaluated from the same
  choices by the same formulas; the solver's own objective is compared too (a proven-optimal plan's
  objective is its evaluated figure), its bound is not (it depends on the solver's path; the live
  plan's gap must stay within its rel_gap instead).

Recorded are only fields that do not depend on this machine: no wall times, solver timings, dates,
versions, spec digests, cache paths, and none of the data plane's measured preprocessing (CPU time per
sample here, this machine's CPU count, the loader sizing drawn from them). Costs come from the
roofline (the datasheet, or a committed calibration): each solve gets an empty profile cache, so an
example on this machine's CPU (`cpu-local`) is never priced by a profile, and the test checks that no
group's cost source is `measured`. An example that insists on measured costs (`MEASURED`, e.g. serving's
`costs: measured`) has no golden plan: its plan is the solving machine's by design.

A plan whose recorded status is not `optimal` stopped at a time limit: another machine may stop at
another incumbent, so only its status is compared. Rollout plans have no status: their simulator is
deterministic by design (rollout.sim_repack gives each simulated repack a round budget, not a clock),
so every policy's figures are compared, its solver wall times excepted.

To record an intended change of plans, regenerate and review the diff:

    PYTHONPATH=. python tests/jobs/test_golden_plans.py [EXAMPLE ...]     # all examples when none named
    git diff tests/jobs/golden_plans/

A plan whose decisions still match (within the tolerances) keeps its file, so the diff shows only the plans
that changed.

`--from-json DIR --recorded-with COMMIT` records from saved `qsync-opt solve examples/X.yaml --json >
DIR/X.json` outputs instead (how the 7f2e188 references were taken, in a worktree of that commit, each
with an empty QSYNC_OPT_PROFILE_DIR).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GOLDEN = Path(__file__).resolve().parent / "golden_plans"
REL = 1e-6
"""Relative tolerance of a figure: its choices are equal, so only the float summation order may differ, and the
indicators are float32 forward/backward sums whose order follows torch's thread count (a process whose earlier work
left one thread moves cpu_hf_llama_pysource's Σω by 5e-8 relative)."""
SLOW = {"hybrid_a100_t4_bert_base", "gpu_gpt2_small", "rollout_laminar"}
"""Examples whose solve takes more than about 20 s (marked slow; CI still runs them)."""
MEASURED = {"serving_cpu_llama": "serving.costs: measured — its costs are timed on the machine that solves it, so "
                                 "its plan is that machine's, not a recorded one"}
"""Examples with no golden plan, and why: their plan depends on this machine by design."""

TRAINING_GROUP = ("device", "count", "local_batch", "precisions", "compute_ms", "comm_exposed_ms", "iteration_ms",
                  "time_bound_ms", "peak_memory_bytes", "memory_capacity_bytes", "indicator")
TRAINING_BASELINE = ("feasible", "iteration_ms", "indicator", "local_batches", "group_indicator", "peak_memory_bytes")
DATA_PLANE = ("policy", "balance", "reference_length", "flops_a", "flops_b", "groups", "demand_samples_per_s")
"""The balance plan; loader_cpus, loader_workers, preprocess_ms, supply_ratio and sizing_status are measured here."""
SERVING_STAGE = ("position", "device", "device_type", "layers", "bits", "prefill_ms", "decode_ms", "memory_gb",
                 "capacity_gb")
ROLLOUT_POLICY = ("variant", "trajectories_per_s", "tokens_per_s", "rollout_idle_frac", "rollout_sync_frac",
                  "rollout_migrate_frac", "trainer_idle_frac", "staleness_mean", "staleness_max", "kv_util_mean",
                  "repacks", "moves", "repack_overhead_s", "sim_time_s", "steps", "ceiling_tps")
"""A simulated policy's figures; solver_wall_ms_mean/max are the repack solver's wall times on this machine."""


def _pick(d: dict, keys) -> dict:
    return {k: d[k] for k in keys}


def decisions(plan: dict) -> dict:
    """The deterministic decision content of a plan's JSON (`to_json()`, or `qsync-opt solve --json`)."""
    if plan.get("kind") == "serving":
        solver = plan["solver"]
        return {
            "kind": "serving", "name": plan["name"], "model": plan["model"], "workload": plan["workload"],
            "status": solver["status"], "backend": solver["backend"], "objective_ms": solver["objective_ms"],
            "stages": [_pick(s, SERVING_STAGE) for s in plan["stages"]],
            "prefill_micro_batch": plan["prefill_micro_batch"], "decode_micro_batch": plan["decode_micro_batch"],
            "prediction": plan["prediction"], "quality_bound": plan["quality_bound"],
            "baselines": [{"name": b["name"], "fits": b["fits"], "prediction": b["prediction"],
                           "prefill_micro_batch": b["prefill_micro_batch"],
                           "decode_micro_batch": b["decode_micro_batch"],
                           "stages": [_pick(s, SERVING_STAGE) for s in b["stages"]]} for b in plan["baselines"]],
        }
    if "loading_plan_version" in plan:  # the data plane's split: integer heuristics, no clock in its decisions
        return {"kind": "loading", **{k: v for k, v in plan.items() if k != "loading_plan_version"}}
    if "policies" in plan:
        return {
            "kind": "rollout", "name": plan["name"], "model": plan["model"], "batch": plan["batch"],
            "steps": plan["steps"], "recommended": plan["recommended"], "reason": plan["reason"],
            "spec_policy": plan["spec_policy"], "policies": [_pick(p, ROLLOUT_POLICY) for p in plan["policies"]],
            "workers": plan["workers"], "broadcast_s": plan["broadcast_s"], "push_s": plan["push_s"],
            "ceiling": plan["ceiling"],
        }
    solver = plan["solver"]
    out = {
        "kind": "training", "job": plan["job"], "model": plan["model"], "objective": plan["objective"],
        "status": solver["status"], "backend": solver["backend"], "solver_objective": solver["objective"],
        "iteration_ms": plan["iteration_ms"], "indicator": plan["indicator"], "meets_bounds": plan["meets_bounds"],
        "boundary": plan["boundary"], "fingerprint": plan["fingerprint"]["digest"],
        "groups": {g: _pick(v, TRAINING_GROUP) for g, v in plan["groups"].items()},
        "baselines": {b: _pick(v, TRAINING_BASELINE) for b, v in plan["baselines"].items()},
    }
    if plan.get("data_plane"):
        out["data_plane"] = _pick(plan["data_plane"], DATA_PLANE)
    return out


def differences(want, got, path: str = "") -> list[str]:
    """Where `got` departs from `want`: floats beyond REL, anything else unequal."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(want) != set(got):
            return [f"{path or '.'}: keys {sorted(set(want) ^ set(got))} differ"]
        return [d for k in want for d in differences(want[k], got[k], f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: {len(want)} items recorded, {len(got)} now"]
        return [d for i, (w, g) in enumerate(zip(want, got)) for d in differences(w, g, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if math.isclose(want, got, rel_tol=REL, abs_tol=1e-300):
            return []
        return [f"{path}: recorded {want!r}, now {got!r}"]
    return [] if want == got and type(want) is type(got) else [f"{path}: recorded {want!r}, now {got!r}"]


def _compared(recorded: dict, now: dict) -> tuple[dict, dict]:
    """The parts compared: everything when the recorded plan is proven optimal (or simulated), else the status."""
    if recorded.get("status", "optimal") == "optimal":
        return recorded, now
    keys = ("kind", "status")
    return _pick(recorded, keys), _pick(now, keys)


def _fixtures() -> list:
    return [pytest.param(p.stem, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else [])
            for p in sorted(GOLDEN.glob("*.json"))]


def test_every_example_has_a_golden_plan():
    examples = {p.stem for p in EXAMPLES.glob("*.yaml")} - set(MEASURED)
    golden = {p.stem for p in GOLDEN.glob("*.json")}
    assert examples == golden, (f"examples without a golden plan: {sorted(examples - golden)}; golden plans without "
                                f"an example: {sorted(golden - examples)} (see this file's docstring to record one)")


@pytest.mark.parametrize("name", _fixtures())
def test_example_plan_is_the_recorded_one(name, tmp_path, monkeypatch):
    import qsync_opt

    recorded = json.loads((GOLDEN / f"{name}.json").read_text())
    monkeypatch.setenv("QSYNC_OPT_PROFILE_DIR", str(tmp_path / "profiles"))  # no profile, no indicator cache
    monkeypatch.chdir(ROOT)
    plan = json.loads(qsync_opt.solve(ROOT / recorded["example"]).to_json())
    now = decisions(plan)
    if now["kind"] == "training":
        assert all(g["cost_source"] != "measured" for g in plan["groups"].values()), "a profile priced this plan"
    if now["kind"] == "serving":
        assert all(st["cost_source"] != "measured" for st in plan["stages"]), "a profile priced this plan"
    if now["kind"] in ("training", "serving") and now["status"] == "optimal":
        rel_gap = plan["solver"].get("rel_gap")
        assert rel_gap is None or plan["solver"]["gap"] <= rel_gap
    want, got = _compared(recorded["decisions"], now)
    diffs = differences(want, got)
    assert not diffs, (f"{recorded['example']}: the plan differs from the one recorded with "
                       f"{recorded['recorded_with']} ({len(diffs)} differences):\n  " + "\n  ".join(diffs[:30]))


def _record(names: list[str], from_json: Path | None, commit: str | None) -> None:
    """Write golden_plans/<name>.json for each example name, from a fresh solve or a saved --json output."""
    if from_json is None:
        os.environ["QSYNC_OPT_PROFILE_DIR"] = tempfile.mkdtemp(prefix="qsync-golden-")
        os.chdir(ROOT)
        import qsync_opt
    if commit is None:
        where = from_json if from_json is not None else Path(qsync_opt.__file__).resolve().parents[1]
        try:
            commit = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    GOLDEN.mkdir(exist_ok=True)
    for name in names:
        if from_json is None:
            plan = json.loads(qsync_opt.solve(EXAMPLES / f"{name}.yaml").to_json())
        else:
            plan = json.loads((from_json / f"{name}.json").read_text())
        record = {"example": f"examples/{name}.yaml", "recorded_with": commit, "decisions": decisions(plan)}
        path = GOLDEN / f"{name}.json"
        if path.exists() and not differences(json.loads(path.read_text())["decisions"], record["decisions"]):
            print(f"unchanged {path.relative_to(ROOT)} (kept as recorded)")
            continue
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {path.relative_to(ROOT)} ({record['decisions'].get('status', 'simulated')})")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Record the golden plans of examples/ (all when none is named).")
    ap.add_argument("examples", nargs="*", help="example names (file stems), e.g. cpu_tiny")
    ap.add_argument("--from-json", type=Path, help="read DIR/<name>.json (qsync-opt solve --json outputs) instead "
                                                   "of solving")
    ap.add_argument("--recorded-with", help="the commit that made the plans (default: this checkout's HEAD)")
    args = ap.parse_args()
    _record(args.examples or sorted(p.stem for p in EXAMPLES.glob("*.yaml") if p.stem not in MEASURED), args.from_json,
            args.recorded_with)
