"""LLM-PQ's 11 evaluation cases: our plan's predicted tokens/s against the baselines, and solve times.

    PYTHONPATH=$PWD python benchmarks/serving.py --out results [--backends highs,cbc,scip,cpsat] [--cases 1,3]

Global batch 32, prompt 512, 100 generated tokens, bits {3, 4, 8, 16}, devices orderable,
quality bound: no worse than the uniform baseline (policy `plan`): its bound is exactly the Σω of the `uniform`
row (same device order and micro-batches), shown in quality_bound beside it; policy `plan@<best>-quality`
repeats the search held to the best baseline's own Σω, i.e. the gain at equal quality. Every figure is predicted by the same cost
model (catalog roofline), so the ratios compare plans, not hardware runs. Writes a table and
DIR/serving.csv (case, policy, tokens_per_s, solve_s, backend, status, ...) with the command
and machine load in a header comment.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qsync_opt.errors import InfeasibleError  # noqa: E402
from qsync_opt.io import atomic_write_text  # noqa: E402
from qsync_opt.serving.planner import plan_serving  # noqa: E402
from qsync_opt.solver.budget import Budget  # noqa: E402
from qsync_opt.solver.backends import EXACT, available  # noqa: E402
from qsync_opt.jobs import load_spec  # noqa: E402

V100 = "V100-32GB"
CASES = [  # (case, model, [(device, count)], objective); case 2 repeats case 1 as a latency run
    (1, "opt-13b", [(V100, 1)], "throughput"),
    (2, "opt-13b", [(V100, 1)], "latency"),
    (3, "opt-30b", [("T4", 3), (V100, 1)], "throughput"),
    (4, "opt-30b", [("P100", 3), (V100, 1)], "throughput"),
    (5, "opt-30b", [("T4", 4)], "throughput"),
    (6, "opt-66b", [("T4", 4), (V100, 2)], "throughput"),
    (7, "opt-66b", [(V100, 2), ("A100-40GB", 2)], "throughput"),
    (8, "opt-66b", [(V100, 4)], "throughput"),
    (9, "bloom-176b", [(V100, 4), ("A100-40GB", 4)], "throughput"),
    (10, "bloom-176b", [(V100, 4), ("A100-80GB", 2)], "throughput"),
    (11, "bloom-176b", [("A100-80GB", 4)], "throughput"),
]
FIELDS = ["case", "model", "devices", "policy", "backend", "tokens_per_s", "ratio_vs_best_baseline", "e2e_s", "quality",
          "quality_bound", "bound_from", "shape", "solve_s", "status", "gap", "programs", "load1"]


def case_spec(model: str, devices, objective: str, backend: str, limit: float) -> dict:
    groups = [{"name": d.lower().replace("-", "_"), "device": d, "count": n} for d, n in devices]
    return {
        "kind": "serving", "name": f"{model}-" + "+".join(f"{n}x{d}" for d, n in devices),
        "cluster": {"groups": groups, "interconnect": "pcie3"},
        "serving": {"model": {"preset": model}, "prompt_len": 512, "gen_tokens": 100, "global_batch": 32,
                    "bits": [3, 4, 8, 16], "orderable": True, "objective": objective},
        "solver": {"backend": backend, "time_limit_s": limit, "rel_gap": 1e-4, "threads": 1},
    }


def run(cases, backends, limit: float) -> list[dict]:
    rows = []
    for case, model, devices, objective in cases:
        label = " + ".join(f"{n}×{d}" for d, n in devices)
        for backend in backends:
            load = os.getloadavg()[0]
            try:
                plan = plan_serving(load_spec(case_spec(model, devices, objective, backend, limit)), Budget(limit))
            except InfeasibleError as e:
                rows.append(dict(case=case, model=model, devices=label, policy="plan", backend=backend, tokens_per_s="",
                                 status="infeasible", solve_s="", load1=f"{load:.2f}", gap="", e2e_s="", quality="",
                                 ratio_vs_best_baseline="", programs=""))
                print(f"case {case}: infeasible: {e}", file=sys.stderr)
                continue
            best = plan.best_baseline()
            ref = best.prediction.tokens_per_s if best else None
            s = plan.solver
            rows.append(dict(case=case, model=model, devices=label, policy="plan", backend=backend,
                             tokens_per_s=f"{plan.prediction.tokens_per_s:.2f}",
                             ratio_vs_best_baseline=f"{plan.prediction.tokens_per_s / ref:.3f}" if ref else "",
                             e2e_s=f"{plan.prediction.e2e_ms / 1e3:.3f}", quality=f"{plan.prediction.quality:.6g}",
                             quality_bound=_fmt(plan.quality_bound), bound_from="uniform" if plan.quality_bound is not None else "",
                             shape=_shape(plan),
                             solve_s=f"{s.wall_s:.3f}", status=s.status, gap="" if s.gap is None else f"{s.gap:.2e}",
                             programs=f"{s.programs}+{s.pruned} pruned", load1=f"{load:.2f}"))
            if backend != backends[0]:
                continue
            if best is not None:  # the same search held to the best baseline's quality: gains at equal Σω
                sp = case_spec(model, devices, objective, backend, limit)
                sp["serving"]["quality"] = {"max_indicator": best.prediction.quality * (1 + 1e-9)}
                eq = plan_serving(load_spec(sp), Budget(limit))
                rows.append(dict(case=case, model=model, devices=label, policy=f"plan@{best.name}-quality", backend=backend,
                                 tokens_per_s=f"{eq.prediction.tokens_per_s:.2f}",
                                 ratio_vs_best_baseline=f"{eq.prediction.tokens_per_s / ref:.3f}",
                                 e2e_s=f"{eq.prediction.e2e_ms / 1e3:.3f}", quality=f"{eq.prediction.quality:.6g}",
                                 quality_bound=_fmt(eq.quality_bound), bound_from=best.name, shape=_shape(eq),
                                 solve_s=f"{eq.solver.wall_s:.3f}", status=eq.solver.status,
                                 gap="" if eq.solver.gap is None else f"{eq.solver.gap:.2e}",
                                 programs=f"{eq.solver.programs}+{eq.solver.pruned} pruned", load1=f"{os.getloadavg()[0]:.2f}"))
            for b in plan.baselines:
                p = b.prediction
                rows.append(dict(case=case, model=model, devices=label, policy=b.name, backend="highs" if b.name != "uniform" else "-",
                                 tokens_per_s=f"{p.tokens_per_s:.2f}" if p else "",
                                 ratio_vs_best_baseline=f"{p.tokens_per_s / ref:.3f}" if p and ref else "",
                                 e2e_s=f"{p.e2e_ms / 1e3:.3f}" if p else "", quality=f"{p.quality:.6g}" if p else "",
                                 shape=_shape(b),
                                 solve_s=f"{b.solve_s:.3f}", status="fits" if b.fits else "does not fit", gap="",
                                 programs="", load1=f"{load:.2f}"))
            print(f"case {case:2d} {model:10s} {label:26s} plan {plan.prediction.tokens_per_s:8.1f} tok/s, best baseline "
                  f"{(best.name + ' ' + format(ref, '.1f')) if best else 'none':>16s}, ×{plan.prediction.tokens_per_s / ref if ref else float('nan'):.2f}, "
                  f"{s.status} in {s.wall_s:.2f} s (load {load:.2f})", flush=True)
    return rows


def _fmt(x) -> str:
    return "" if x is None else f"{x:.6g}"


def _shape(b) -> str:
    """A plan's or baseline's bit-widths, device order and micro-batch sizes, e.g. '8-bit; A100>V100; mb 1/8'."""
    if not b.stages:
        return ""
    bits = sorted({x for st in b.stages for x in st.bits}, reverse=True)
    return (f"{'/'.join(map(str, bits))}-bit; {'>'.join(st.device for st in b.stages)}; "
            f"mb {b.prefill_micro_batch}/{b.decode_micro_batch}")


def table(rows: list[dict]) -> str:
    out = io.StringIO()
    cols = ["case", "model", "devices", "policy", "backend", "tokens_per_s", "ratio_vs_best_baseline", "quality", "quality_bound",
            "bound_from", "shape", "solve_s", "status", "gap", "load1"]
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    out.write("  ".join(c.ljust(widths[c]) for c in cols) + "\n")
    for r in rows:
        out.write("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) + "\n")
    return out.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="directory for serving.csv (default: benchmarks/results)")
    ap.add_argument("--backends", default="highs", help=f"comma-separated, first is the default; exact: {','.join(EXACT)}")
    ap.add_argument("--cases", help="comma-separated case numbers (default: all 11)")
    ap.add_argument("--limit", type=float, default=60.0, help="time limit per case and backend, s")
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): case 1 with highs, 10 s limit; needs --out")
    args = ap.parse_args(argv)
    if args.smoke and args.out is None:
        ap.error("--smoke needs --out DIR: a smoke run never writes benchmarks/results")
    args.out = args.out or str(Path(__file__).resolve().parent / "results")
    if args.smoke:
        args.backends, args.cases, args.limit = "highs", "1", 10.0
    backends = [b for b in args.backends.split(",") if b]
    missing = [b for b in backends if b not in EXACT or not available().get(b)]
    if missing:
        ap.error(f"--backends: {missing} not exact or not available; available exact: {[b for b in EXACT if available().get(b)]}")
    cases = [c for c in CASES if not args.cases or str(c[0]) in args.cases.split(",")]
    t0 = time.perf_counter()
    rows = run(cases, backends, args.limit)
    text = table(rows)
    print(text)
    print(f"load average at end: {os.getloadavg()}, total {time.perf_counter() - t0:.1f} s")
    buf = io.StringIO()
    buf.write(f"# command: PYTHONPATH=$PWD python benchmarks/serving.py {' '.join(argv if argv is not None else sys.argv[1:])}\n")
    buf.write(f"# machine load (1/5/15 min) at start of each row in load1; at end: {os.getloadavg()}\n")
    w = csv.DictWriter(buf, fieldnames=FIELDS)
    w.writeheader()
    w.writerows(rows)
    path = atomic_write_text(Path(args.out) / "serving.csv", buf.getvalue())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
