"""What the balancer's exact stage wins on balance.py's batches, against what it costs.

For each setting of a balance.py run (its raw JSON: the final per-rank fitted curves and
speeds), draws --batches global batches from the same plane and splits each twice: the
heuristic alone (Karmarkar-Karp / LPT with local search) and the heuristic followed by the
exact stage at the plane's budget (CP-SAT, 0.02 deterministic seconds, gap 1%, min_gain 0,
i.e. the stage runs whenever the heuristic is not proven within 1%). Prints per run and setting
how many batches the exact stage ran on, and the
median and range of: the predicted slowest-rank ms the exact stage won, the room it could
have won at most (heuristic slowest load less the lower bound, the quantity min_gain tests),
and both planning times.

    PYTHONPATH=. python benchmarks/balance_exact_gain.py --raw benchmarks/results/balance_raw.json [--raw OTHER] --out DIR
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import balance as bb  # noqa: E402
from qsync_opt.loading import balance as B  # noqa: E402
from qsync_opt.loading.cost import CostModel  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", action="append", help="a balance.py raw JSON; may be repeated")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): benchmarks/results/balance_raw.json (read only), 2 batches")
    args = ap.parse_args(argv)
    if args.smoke:
        args.raw, args.batches = args.raw or [str(ROOT / "benchmarks" / "results" / "balance_raw.json")], 2
    if not args.raw:
        ap.error("--raw PATH is required (a balance.py raw JSON)")
    bb.ARGS = argparse.Namespace(batch=args.batch)
    load_start = "/".join(f"{x:.1f}" for x in os.getloadavg())
    rows = []
    cases = [(raw, setting, m) for raw in args.raw for setting, m in json.loads(Path(raw).read_text())["meta"].items()]
    warm = True
    for raw, setting, m in cases:
        fits = [CostModel(**f) for f in m["fit"]]
        plane = bb.make_plane(m["speeds"], fits)
        won, room, t_exact, t_heur, ran = [], [], [], [], 0
        for _ in range(args.batches):
            p = plane.next_batch()
            matrix = list(zip(*(f.costs(p.lengths) for f in fits)))
            inst = B.make_instance(fits[0].costs(p.lengths), plane.speeds, p.lengths, rank_costs=matrix)
            if warm:  # the process's first CP-SAT call loads the solver; not a planning cost
                B.balance(inst, backend="cpsat", time_limit_s=1.0, work_limit=0.02)
                warm = False
            gc.collect()  # a generation-2 collection would otherwise land inside a timed call
            h = B.balance(inst, backend=None)
            gc.collect()
            e = B.balance(inst, backend="cpsat", time_limit_s=1.0, work_limit=0.02, gap_tol=1e-2)
            ran += "exact_status" in e.detail
            won.append(1e3 * (h.makespan - e.makespan) * inst.scale)
            room.append(1e3 * (h.makespan - h.bound) * inst.scale)
            t_exact.append(1e3 * e.plan_s)
            t_heur.append(1e3 * h.plan_s)
        for name, xs in (("exact_won_ms", won), ("room_ms", room), ("plan_with_exact_ms", t_exact),
                         ("plan_heuristic_ms", t_heur)):
            rows.append({"raw": raw, "setting": setting, "exact_ran": ran, "quantity": name, "median": round(statistics.median(xs), 2),
                         "min": round(min(xs), 2), "max": round(max(xs), 2), "batches": len(xs)})
    load_end = "/".join(f"{x:.1f}" for x in os.getloadavg())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = "PYTHONPATH=. python benchmarks/balance_exact_gain.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"# command: {cmd}", f"# machine load (1/5/15 min) at start {load_start}, at end {load_end}",
             "raw,setting,exact_ran,quantity,median,min,max,batches"]
    lines += [",".join(str(r[k]) for k in ("raw", "setting", "exact_ran", "quantity", "median", "min", "max", "batches"))
              for r in rows]
    (out / "balance_exact_gain.csv").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
