"""The balancer at production scale: plan time and plan quality from 256 to 16,384 samples over 8 to 512 ranks.

Cases: N in {256, 1024, 4096, 16384} samples over K in {8, 64, 512} ranks (N >= K), rank speeds
equal, halves (1.0 / 0.5) or thirds (1.0 / 0.6 / 0.3), lengths lognormal (median 1,000,
p99/median 10, at most 16,384 tokens) or bimodal (3:1 short, median 256, and long, median
8,192). A sample of L tokens costs c(L) = a·L + b·L² FLOPs of a 7B-class decoder (Llama-2-7B's
shape: 32 layers, hidden 4,096, 6.6e9 matmul weights, causal attention; `loading.cost.from_shape`).
Each case draws --calls global batches (seeded per case) and plans each one.

Columns:
- plan_ms_median / plan_ms_p99: wall time of one plan (costs, make_instance and balance) with the data
  plane's defaults (CP-SAT, 0.02 deterministic s, plan_time_limit 1 s, gap 1%); cpu_ms_median:
  the same in process CPU time (the machine is shared: the load is in the header).
- gap_median / gap_max: makespan over the proven lower bound, less 1; within_1pct: how many
  calls are within 1% of it; bound: which bound was the largest on the worst call (area: total
  work over total speed; single: the largest sample on its cheapest rank; large_area: the j
  largest samples' work over the speed of the ranks that can hold one; counting: the j largest
  samples by count).
- vs_old_max: the largest (new - old) / old makespan over the calls also planned by today's
  implementation (main at 7f2e188, kept in tests/loading/balance_reference.py: its heuristic
  path, `balance(inst, backend=None)`); old_ms_median its plan time; old_calls how many.
- exact_ran / exact_won_max / exact_ms_max / exact_time_limited: the plane's budget with gap 0
  (the exact stage runs whenever the bound does not prove the heuristic optimal and its model
  fits the 1 s limit): on how many calls it ran, the most it shortened the makespan (relative),
  the longest such call, how many hit the wall clock.
- defaults_ms_max: `balance(inst)` with its own defaults (HiGHS, 0.05 s limit, gap 0), the
  longest of up to 3 calls (its limit now bounds the whole call).

    PYTHONPATH=. python benchmarks/balance_scale.py --out DIR [--calls 15] [--old-calls 3]
    PYTHONPATH=. python benchmarks/balance_scale.py --smoke --out DIR   # one case, 3 calls
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.results_table import load_now, write_table  # noqa: E402
from qsync_opt.loading import balance as B  # noqa: E402
from qsync_opt.loading.cost import from_shape  # noqa: E402
from tests.loading import balance_reference as REF  # noqa: E402

NS = (256, 1024, 4096, 16384)
KS = (8, 64, 512)
SPEEDS = {"equal": (1.0,), "halves": (1.0, 0.5), "thirds": (1.0, 0.6, 0.3)}
LAYERS, HIDDEN, FFN, VOCAB = 32, 4096, 11008, 32000
LINEAR = LAYERS * (4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN) + HIDDEN * VOCAB  # Llama-2-7B's matmul weights
COST = from_shape(LINEAR, LAYERS, HIDDEN, causal=True)
MAX_LEN = 16384
SIGMA = math.log(10) / 2.326348  # p99 / median = 10
PLANE = dict(backend="cpsat", time_limit_s=1.0, work_limit=0.02, gap_tol=1e-2)  # DataSpec's defaults
EXACT = dict(PLANE, gap_tol=0.0)
COLUMNS = ["n", "ranks", "speeds", "lengths", "calls", "plan_ms_median", "plan_ms_p99", "cpu_ms_median",
           "gap_median", "gap_max", "within_1pct", "bound", "vs_old_max", "old_ms_median", "old_calls",
           "exact_ran", "exact_won_max", "exact_ms_max", "exact_time_limited", "defaults_ms_max"]


def rank_speeds(name: str, k: int) -> list[float]:
    """The ranks split into equal groups, one per speed, fastest first."""
    levels = SPEEDS[name]
    return [levels[len(levels) * r // k] for r in range(k)]


def lengths_of(dist: str, n: int, rng: np.random.Generator) -> list[int]:
    if dist == "lognormal":
        x = rng.lognormal(math.log(1000), SIGMA, n)
    else:
        long = rng.random(n) < 0.25
        x = np.where(long, rng.lognormal(math.log(8192), 0.25, n), rng.lognormal(math.log(256), 0.5, n))
    return np.clip(np.rint(x), 1, MAX_LEN).astype(np.int64).tolist()


def costs_of(lengths: list[int]) -> list[float]:
    L = np.asarray(lengths, dtype=float)
    return (COST.a * L + COST.b * L * L).tolist()


def bound_source(inst) -> str:
    named = {"area": B.area_bound(inst), "single": B.single_bound(inst), "large_area": B.large_area_bound(inst),
             "counting": B.counting_bound(inst)}
    return max(named, key=named.get)


def plan(lengths, speeds, **kw):
    """costs, make_instance and balance, timed in wall and CPU seconds."""
    gc.collect()  # a collection would otherwise land inside a timed call: a pause of the process, not the planner
    t, c = time.perf_counter(), time.process_time()
    inst = B.make_instance(costs_of(lengths), speeds, lengths)
    res = B.balance(inst, **kw)
    return inst, res, time.perf_counter() - t, time.process_time() - c


def run_case(n, k, sp_name, dist, args, old_calls) -> dict:
    seed = [n, k, list(SPEEDS).index(sp_name), dist == "bimodal"]
    rng = np.random.default_rng(seed)
    speeds = rank_speeds(sp_name, k)
    wall, cpu, gaps, worst, vs_old, old_ms = [], [], [], None, [], []
    exact_ran, exact_won, exact_ms, exact_tl, dflt_ms = 0, [], [], 0, []
    for call in range(args.calls):
        lengths = lengths_of(dist, n, rng)
        inst, res, w, c = plan(lengths, speeds, **PLANE)
        wall.append(w)
        cpu.append(c)
        gap = res.makespan / max(res.bound, 1) - 1
        gaps.append(gap)
        if worst is None or gap > worst[0]:
            worst = (gap, inst)
        if call < old_calls:
            ref_inst = REF.make_instance(costs_of(lengths), speeds, lengths)
            t = time.perf_counter()
            old = REF.reference_balance(ref_inst)
            old_ms.append(time.perf_counter() - t)
            vs_old.append((res.makespan - old.makespan) / old.makespan)
        if call < args.exact_calls:
            _, ex, w, _ = plan(lengths, speeds, **EXACT)
            if "exact_status" in ex.detail:
                exact_ran += 1
                exact_ms.append(w)
                exact_tl += bool(ex.detail.get("time_limited"))
            exact_won.append((res.makespan - ex.makespan) / res.makespan)
        if call < 3:
            dflt_ms.append(plan(lengths, speeds)[2])
    ms = [1e3 * x for x in wall]
    return {
        "n": n, "ranks": k, "speeds": sp_name, "lengths": dist, "calls": args.calls,
        "plan_ms_median": round(statistics.median(ms), 2), "plan_ms_p99": round(float(np.percentile(ms, 99)), 2),
        "cpu_ms_median": round(1e3 * statistics.median(cpu), 2),
        "gap_median": f"{statistics.median(gaps):.2e}", "gap_max": f"{max(gaps):.2e}",
        "within_1pct": sum(g <= 0.01 for g in gaps), "bound": bound_source(worst[1]),
        "vs_old_max": f"{max(vs_old):.2e}" if vs_old else "",
        "old_ms_median": round(1e3 * statistics.median(old_ms), 1) if old_ms else "", "old_calls": len(vs_old),
        "exact_ran": exact_ran, "exact_won_max": f"{max(exact_won):.2e}" if exact_won else "",
        "exact_ms_max": round(1e3 * max(exact_ms), 1) if exact_ms else "", "exact_time_limited": exact_tl,
        "defaults_ms_max": round(1e3 * max(dflt_ms), 2),
    }


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for balance_scale.csv")
    ap.add_argument("--smoke", action="store_true", help="one case (256 samples, 8 ranks, halves, lognormal), 3 calls")
    ap.add_argument("--calls", type=int, default=15, help="batches planned per case (default 15)")
    ap.add_argument("--old-calls", type=int, default=3,
                    help="of those, how many today's implementation also plans (1 above 2**18 samples x ranks)")
    ap.add_argument("--exact-calls", type=int, default=5, help="of those, how many with the exact stage at gap 0")
    args = ap.parse_args(argv)
    for flag, v in (("--calls", args.calls), ("--old-calls", args.old_calls), ("--exact-calls", args.exact_calls)):
        if v < (1 if flag == "--calls" else 0):
            ap.error(f"{flag} must be >= {1 if flag == '--calls' else 0}, got {v}")
    cases = [(n, k, s, d) for n in NS for k in KS if n >= k for s in SPEEDS for d in ("lognormal", "bimodal")]
    if args.smoke:
        cases = [(256, 8, "halves", "lognormal")]
        args.calls, args.old_calls, args.exact_calls = 3, 1, 1
    load_before = load_now()
    warm = B.make_instance([3.0, 2.0, 2.0, 1.0, 1.0], [1.0, 0.5], [3, 2, 2, 1, 1])
    for backend in ("cpsat", "highs"):  # a process's first solve loads the solver: not a planning cost
        B.solve_exact(warm, backend, 1.0)
    rows = []
    for n, k, s, d in cases:
        old_calls = min(args.old_calls, args.calls, 1 if n * k > 2**18 else args.old_calls)
        row = run_case(n, k, s, d, args, old_calls)
        rows.append(row)
        print("  ".join(f"{c}={row[c]}" for c in COLUMNS), flush=True)
    path = write_table(Path(args.out) / "balance_scale.csv", "balance_scale.py", argv, COLUMNS, rows, load_before)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
