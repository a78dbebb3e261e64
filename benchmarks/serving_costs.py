"""Measured per-layer serving costs on this machine beside the roofline, and the plans each prices.

    PYTHONPATH=$PWD python benchmarks/serving_costs.py --out DIR [--spec examples/serving_cpu_llama.yaml] [--smoke]

Profiles every group of the spec whose device is here (qsync_opt/serving/profile.py: one decoder layer's prefill
and decode, and the embedding + LM head, per bit-width and micro-batch, each in a process with the group's env)
into DIR/profiles (a fresh cache: never the user's), then plans the spec with `serving.costs: measured` and
`roofline`. Prints both tables with the machine load and writes

- DIR/serving_costs.csv: group, device, env, bits ('head' for embedding + LM head), micro_batch, phase,
  measured_ms, roofline_ms, measured_over_roofline, load1 (before, after);
- DIR/serving_costs_plans.csv: costs, predicted tokens/s, micro-batches, the partition (device:layers@bits per
  stage), each stage's cost source, the solver status.

The figures are this machine's under its load at the time (the header comment has both): on a shared CPU a
layer's time moves by tens of percent between runs. --smoke: two micro-batch sizes and the fewest timed calls.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["group", "device", "env", "bits", "micro_batch", "phase", "measured_ms", "roofline_ms",
          "measured_over_roofline"]
PLAN_FIELDS = ["costs", "tokens_per_s", "prefill_mb", "decode_mb", "partition", "stage_sources", "status"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--spec", default=str(ROOT / "examples" / "serving_cpu_llama.yaml"))
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ["QSYNC_OPT_PROFILE_DIR"] = str(a.out / "profiles")  # fresh figures; never the user's cache
    if a.smoke:  # read at import by serving.profile, here and in its measuring processes
        os.environ.update(QSYNC_OPT_SERVING_PROFILE_FLOOR="1", QSYNC_OPT_SERVING_PROFILE_CAP="2",
                          QSYNC_OPT_SERVING_PROFILE_BUDGET_MS="1")

    import yaml

    from qsync_opt.io import atomic_write_text
    from qsync_opt.serving import profile as P
    from qsync_opt.serving import profile_report as R
    from qsync_opt.serving.planner import plan_serving
    from qsync_opt.serving.spec import load_serving_spec
    from qsync_opt.solver.budget import Budget

    doc = yaml.safe_load(Path(a.spec).read_text())
    if a.smoke:
        doc["serving"]["micro_batches"] = {"prefill": [1, doc["serving"]["global_batch"]],
                                           "decode": [1, doc["serving"]["global_batch"]]}
    measured = load_serving_spec({**doc, "serving": {**doc["serving"], "costs": "measured"}})
    roofline = load_serving_spec({**doc, "serving": {**doc["serving"], "costs": "roofline"}})
    load0 = os.getloadavg()[0]
    P.profile_job(measured, log=lambda m: print(m, file=sys.stderr))
    load1 = os.getloadavg()[0]
    prof = P.load(P.default_path())
    rows = []
    for g in measured.cluster.groups:
        if not P.present(g.device_spec):
            continue
        for bits, m, mp, rp, md, rd in R.rows(measured, g, prof.entries(P.table_key(measured, g))):
            for phase, meas, roof in (("prefill", mp, rp), ("decode", md, rd)):
                rows.append({"group": g.name, "device": g.device_spec.name,
                             "env": " ".join(f"{k}={v}" for k, v in sorted(g.env.items())), "bits": bits,
                             "micro_batch": m, "phase": phase, "measured_ms": f"{meas:.5g}",
                             "roofline_ms": f"{roof:.5g}", "measured_over_roofline": f"{meas / roof:.3g}"})
    plans = {}
    for name, job in (("measured", measured), ("roofline", roofline)):
        plans[name] = plan_serving(job, Budget(job.solver.time_limit_s))
    prows = []
    for name, plan in plans.items():
        prows.append({"costs": name, "tokens_per_s": f"{plan.prediction.tokens_per_s:.1f}",
                      "prefill_mb": plan.prefill_micro_batch, "decode_mb": plan.decode_micro_batch,
                      "partition": " ".join(f"{s.device}:{s.layers[1] - s.layers[0]}@{'/'.join(map(str, s.bit_counts))}"
                                            for s in plan.stages),
                      "stage_sources": " ".join(s.cost_source for s in plan.stages), "status": plan.solver.status})
    cmd = "python benchmarks/serving_costs.py " + " ".join(argv if argv is not None else sys.argv[1:])
    spec = os.path.relpath(a.spec, ROOT) if Path(a.spec).resolve().is_relative_to(ROOT) else a.spec
    head = (f"# {cmd}\n# spec {spec}; machine {P.machine_description()}; threads per group from its env; "
            f"load1 before {load0:.2f}, after profiling {load1:.2f} (2-core machine shared with other work)\n")
    for path, fields, data in ((a.out / "serving_costs.csv", FIELDS, rows),
                               (a.out / "serving_costs_plans.csv", PLAN_FIELDS, prows)):
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=fields)
        w.writeheader()
        w.writerows(data)
        atomic_write_text(path, head + buf.getvalue())
    print(head, end="")
    print(f"{'group':8} {'bits':>4} {'m':>2} {'phase':8} {'measured ms':>12} {'roofline ms':>12} {'ratio':>6}")
    for r in rows:
        print(f"{r['group']:8} {r['bits']!s:>4} {r['micro_batch']:>2} {r['phase']:8} {r['measured_ms']:>12} "
              f"{r['roofline_ms']:>12} {r['measured_over_roofline']:>6}")
    for r in prows:
        print(f"plan with {r['costs']} costs: {r['tokens_per_s']} tokens/s predicted, micro-batches "
              f"{r['prefill_mb']}/{r['decode_mb']}, {r['partition']} ({r['status']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
