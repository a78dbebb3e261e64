"""Measure every backend on synthetic instances (a script, not a test).

    python tests/solver/measure_backends.py [--sizes 50,200,1000,5000] [--kinds chain,dag]
        [--backends highs,cbc,scip,cpsat,greedy] [--limit 60] [--gap 1e-3] [--csv out.csv]

Each (size, kind, backend) runs in a fresh subprocess (memory and crashes stay contained);
time is the backend's wall time, model building included, compile excluded.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time


def one(n: int, kind: str, backend: str, limit: float, gap: float, seed: int) -> dict:
    from qsync_opt.solver.backends import SolveOptions, get_backend
    from qsync_opt.solver.greedy import greedy
    from qsync_opt.solver.instance import evaluate
    from qsync_opt.solver.random_instances import synthetic
    from qsync_opt.solver.training import compile_training

    inst = synthetic(n, 5, 4, kind, seed=seed)
    t0 = time.perf_counter()
    problem = compile_training(inst)
    compile_s = time.perf_counter() - t0
    g = greedy(inst)
    hint = problem.encode(g.assignment) if g.feasible else None
    r = get_backend(backend).solve(problem, SolveOptions(time_limit_s=limit, rel_gap=gap, seed=seed, hint=hint))
    ok = None
    if r.values is not None:
        ok = evaluate(inst, problem.decode(r.values)).feasible
    return {
        "n_ops": n, "kind": kind, "backend": backend, "status": r.status, "wall_s": round(r.wall_s, 2),
        "compile_s": round(compile_s, 2), "objective": r.objective, "bound": r.bound, "gap": r.gap,
        "greedy": problem.objective_value(hint) if hint else None, "plan_checks": ok,
        "pairs": len(problem.pairs), "binaries": len(problem.choices),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="50,200,1000,5000")
    ap.add_argument("--kinds", default="chain,dag")
    ap.add_argument("--backends", default="highs,cbc,scip,cpsat,greedy")
    ap.add_argument("--limit", type=float, default=60.0)
    ap.add_argument("--gap", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        n, kind, backend = a.one.split(":")
        print(json.dumps(one(int(n), kind, backend, a.limit, a.gap, a.seed)))
        return
    rows = []
    print(f"{'n_ops':>6} {'kind':5} {'backend':7} {'status':10} {'wall_s':>7} {'gap':>9} {'objective':>12} {'vs greedy':>9}")
    for n in map(int, a.sizes.split(",")):
        for kind in a.kinds.split(","):
            for backend in a.backends.split(","):
                cmd = [sys.executable, __file__, "--one", f"{n}:{kind}:{backend}", "--limit", str(a.limit), "--gap", str(a.gap), "--seed", str(a.seed)]
                try:
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.limit * 4 + 300)
                    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
                    row = json.loads(line[-1]) if line else {"n_ops": n, "kind": kind, "backend": backend, "status": f"crash rc={out.returncode}"}
                except subprocess.TimeoutExpired:
                    row = {"n_ops": n, "kind": kind, "backend": backend, "status": "killed"}
                rows.append(row)
                gap = "" if row.get("gap") is None else f"{row['gap']:.2e}"
                obj = row.get("objective")
                rel = "" if not obj or not row.get("greedy") else f"{row['greedy'] / obj:.3f}x"
                print(f"{n:>6} {kind:5} {backend:7} {row['status']:10} {row.get('wall_s', ''):>7} {gap:>9} "
                      f"{'' if obj is None else f'{obj:.6g}':>12} {rel:>9}", flush=True)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
