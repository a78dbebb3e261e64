"""Held-out check of the calibrated roofline: a plan solved on the datasheet roofline, priced both ways.

The calibration (qsync_opt/hardware/calibration.yaml) is fitted on the module shapes of
benchmarks/gpu_check.py, not on any model, so a model run on the same GPU is a held-out test:

  1. solve SPEC with the datasheet roofline alone (calibration switched off), as the run on the
     GPU did, and save the plan;
  2. replay that same plan under the datasheet roofline and under the calibrated one;
  3. print both predictions beside the measured iteration when one is given (--measured-ms, the
     median step of `qsync-opt run` on the device; --plan-counts, the plan's ops per precision there,
     to confirm step 1 found the same plan).

Nothing here is tuned: the factors are the fitted ones.

    python benchmarks/calibration_heldout.py examples/gpu_gpt2_small.yaml --measured-ms 202.92 \\
        --plan-counts fp32:42,fp16:33 --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock


def datasheet_only():
    """A context in which no calibration factor applies (every device priced from the catalog)."""
    from qsync_opt.hardware import calibration

    return mock.patch.object(calibration, "factors", lambda: ())


def smoke_spec(folder: Path) -> Path:
    """examples/gpu_gpt2_small.yaml with the zoo's 2-layer GPT-2 and a small batch, written to folder/."""
    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "gpu_gpt2_small.yaml").read_text())
    spec["model"] = {"name": "tiny-gpt2"}
    spec["training"].update(global_batch=4, seq_len=32)
    spec["objective"]["max_iteration_time"] = "auto"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gpt2_tiny_smoke.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def counts(precisions: dict[str, str]) -> str:
    from qsync_opt.precision import PRECISIONS

    c = {p: list(precisions.values()).count(p) for p in PRECISIONS}
    return " ".join(f"{p}:{n}" for p, n in c.items() if n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="?", help="the spec run on the GPU (--smoke: a tiny GPT-2 on an H200 instead)")
    ap.add_argument("--smoke", action="store_true", help="the whole path on a 2-layer GPT-2 spec written to --out")
    ap.add_argument("--out", type=Path, required=True, help="folder for the plan and heldout.json")
    ap.add_argument("--measured-ms", type=float, default=None, help="measured median iteration on the device")
    ap.add_argument("--plan-counts", default=None, help="the device run's plan as 'fp32:42,fp16:33'")
    args = ap.parse_args(argv)
    if args.smoke:
        args.spec = str(smoke_spec(args.out))
    elif not args.spec:
        ap.error("give SPEC (or --smoke)")

    from qsync_opt.errors import QSyncError
    from qsync_opt.io import atomic_write_text
    from qsync_opt.training.pipeline import solve
    from qsync_opt.training.run_stages import predict_plan

    try:
        args.out.mkdir(parents=True, exist_ok=True)
        plan_path = args.out / "plan_datasheet.json"
        with datasheet_only():
            plan = solve(args.spec)
            plan.save(plan_path)
            _, ctx_d, tl_d = predict_plan(args.spec, plan_path)
        _, ctx_c, tl_c = predict_plan(args.spec, plan_path)
    except QSyncError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    row = {"spec": args.spec, "plan": {n: counts(g.precisions) for n, g in plan.groups.items()},
           "datasheet_ms": round(tl_d.iteration_ms, 2), "calibrated_ms": round(tl_c.iteration_ms, 2),
           "datasheet_costs": {g.name: g.cost_source for g in ctx_d.groups},
           "calibrated_costs": {g.name: g.cost_source for g in ctx_c.groups},
           "groups": {g: {"datasheet": _parts(tl_d.groups[g]), "calibrated": _parts(tl_c.groups[g])}
                      for g in tl_c.groups},
           "ms_by_op_kind": {g.name: {"datasheet": _by_kind(ctx_d.group(g.name), plan.groups[g.name].precisions),
                                      "calibrated": _by_kind(g, plan.groups[g.name].precisions)}
                             for g in ctx_c.groups}}
    if args.plan_counts:
        want = args.plan_counts.replace(",", " ")
        row["same_plan_as_device_run"] = all(c == want for c in row["plan"].values())
    if args.measured_ms:
        row["measured_ms"] = args.measured_ms
        row["datasheet_over_measured"] = round(tl_d.iteration_ms / args.measured_ms, 3)
        row["calibrated_over_measured"] = round(tl_c.iteration_ms / args.measured_ms, 3)
    atomic_write_text(args.out / "heldout.json", json.dumps(row, indent=1) + "\n")
    print(json.dumps(row, indent=1))
    return 0


def _by_kind(gc, precisions: dict[str, str]) -> dict[str, float]:
    """Forward+backward ms per (graph op kind, precision) of the plan: where the prediction's time goes."""
    out: dict[str, float] = {}
    for op, p in precisions.items():
        key = f"{gc.graph.node(op).kind} {p}"
        out[key] = out.get(key, 0.0) + gc.costs[op][p].total_ms
    for op, per in gc.other_costs.items():
        key = f"{gc.graph.node(op).kind} (not selectable)"
        out[key] = out.get(key, 0.0) + per["fp32"].total_ms
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def _parts(t) -> dict:
    return {k: round(getattr(t, k), 2) for k in ("forward_ms", "backward_ms", "cast_ms", "optimizer_ms", "iteration_ms")}


if __name__ == "__main__":
    sys.exit(main())
