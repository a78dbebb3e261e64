"""`qsync_opt.solve` called as a scheduler calls it: from many threads, or many processes, at once.

    PYTHONPATH=$PWD python benchmarks/concurrency.py --out DIR [--threads 1,4,16] [--processes 1,4,16]
        [--examples examples/a.yaml,...] [--backends highs,cbc,scip,cpsat] [--reps 1]

Jobs are every example x every exact backend (x reps). Each configuration (threads or
processes, N workers) runs the whole job list in a fresh Python process, so peak memory is
that configuration's own. `threads 1` is the serial reference: for every other row,
"differ" counts plans whose status, objective or precision maps (serving: stages, bits and
micro-batches) are not exactly the serial plan's. Columns: errors, differing plans,
solves/s (jobs / wall seconds of the whole burst; processes: after their start-up, which
is reported apart as start_s: a scheduler's pool pays it once), peak RSS (threads: the one process; processes: the largest
worker and the sum of the workers' peaks), the interpreter-with-torch baseline they are
measured against. Prints a table; writes DIR/concurrency.csv with the command and the
machine load in its header.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("examples/cpu_tiny.yaml", "examples/hybrid_v100_t4_resnet50.yaml",
            "examples/hybrid_a100_t4_bert_base.yaml", "examples/serving_opt30b_t4_v100.yaml")
BACKENDS = ("highs", "cbc", "scip", "cpsat")


def _rss_mb(field: str = "VmHWM") -> float:
    """This process's resident memory (VmRSS) or its peak so far (VmHWM), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def plan_key(plan) -> list:
    """What a user relies on, as JSON: status, objective and the decisions."""
    if getattr(plan, "kind", "training") == "serving":
        s = plan.solver
        return [s.status, s.objective_ms, [[st.device, list(st.layers), list(st.bits)] for st in plan.stages],
                plan.prefill_micro_batch, plan.decode_micro_batch]
    return [plan.solver.status, plan.solver.objective,
            {g: dict(sorted(gp.precisions.items())) for g, gp in sorted(plan.groups.items())}]


def run_job(job: tuple[str, str, float | None]) -> tuple[object, float]:
    """(plan key, or 'ERROR ...'; this process's peak RSS in MB) of one solve."""
    import qsync_opt

    example, backend, limit = job
    extra = {} if limit is None else {"time_limit_s": limit}
    try:
        key = plan_key(qsync_opt.solve(str(ROOT / example), backend=backend, **extra))
    except Exception as e:  # noqa: BLE001 - counted as an error in the table
        key = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return key, _rss_mb()


def _import_qsync() -> None:
    import qsync_opt  # noqa: F401
    import qsync_opt.training.pipeline  # noqa: F401


def worker(mode: str, n: int, jobs: list[tuple]) -> dict:
    """One configuration, in this (fresh) process."""
    _import_qsync()
    baseline = _rss_mb("VmRSS")
    t0, started = time.perf_counter(), 0.0
    if mode == "threads":
        with ThreadPoolExecutor(n) as pool:
            out = list(pool.map(run_job, jobs))
        peak = peak_sum = _rss_mb()
    else:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        with ctx.Manager() as manager, ProcessPoolExecutor(n, mp_context=ctx, initializer=_import_qsync) as pool:
            barrier = manager.Barrier(n)  # n tasks that wait for each other: n workers started and warm
            list(pool.map(_rendezvous, [barrier] * n))
            started = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = list(pool.map(run_job, jobs))
        readings = sorted((r for _, r in out), reverse=True)
        peak = readings[0]
        peak_sum = sum(readings[:n])  # each worker's own peak is among its jobs' readings: an upper bound
    return {"keys": [k for k, _ in out], "wall_s": time.perf_counter() - t0, "peak_mb": peak,
            "baseline_mb": baseline, "peak_sum_mb": peak_sum, "start_s": started}


def _rendezvous(barrier) -> None:
    barrier.wait(600)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for concurrency.csv")
    ap.add_argument("--threads", default="1,4,16")
    ap.add_argument("--processes", default="1,4,16")
    ap.add_argument("--examples", default=",".join(EXAMPLES))
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--reps", type=int, default=1, help="each example x backend this many times per configuration")
    ap.add_argument("--time-limit", type=float, help="override every spec's solver.time_limit_s (default: the examples' own)")
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): examples/cpu_tiny.yaml with highs twice, serially, on 2 "
                         "threads and in 2 processes")
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--jobs", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), [tuple(j) for j in json.loads(args.jobs)])))
        return 0
    if args.out is None:
        ap.error("--out DIR is required")
    if args.smoke:
        args.threads, args.processes, args.examples, args.backends, args.reps = "1,2", "2", EXAMPLES[0], "highs", 2
    jobs = [(e, b, args.time_limit) for _ in range(args.reps) for e in args.examples.split(",")
            for b in args.backends.split(",")]
    configs = [("threads", int(n)) for n in args.threads.split(",") if n] + \
              [("processes", int(n)) for n in args.processes.split(",") if n]
    if ("threads", 1) in configs:  # the serial reference runs first
        configs.remove(("threads", 1))
    configs.insert(0, ("threads", 1))
    command = "PYTHONPATH=$PWD python benchmarks/concurrency.py " + " ".join(sys.argv[1:] if argv is None else argv)
    load0 = os.getloadavg()
    print(f"{len(jobs)} solves per configuration; machine load {load0}", flush=True)
    rows, serial = [], None
    env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    for mode, n in configs:
        load = os.getloadavg()[0]
        proc = subprocess.run([sys.executable, __file__, "--worker", mode, str(n), "--jobs", json.dumps(jobs)],
                              capture_output=True, text=True, env=env, cwd=ROOT)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{mode} x {n} crashed (exit {proc.returncode})")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        keys = res["keys"]
        if serial is None:
            serial = {tuple(j): k for j, k in zip(jobs, keys)}
        errors = [k for k in keys if isinstance(k, str)]
        differ = [(j, k) for j, k in zip(jobs, keys) if not isinstance(k, str) and k != serial[tuple(j)]]
        for j, k in differ:
            print(f"  differs: {mode} x {n} {j}: {k[:2]} vs serial {serial[tuple(j)][:2]}", flush=True)
        for e in sorted(set(errors)):
            print(f"  error: {mode} x {n}: {e}", flush=True)
        row = {"mode": mode, "workers": n, "solves": len(jobs), "errors": len(errors), "differ_from_serial": len(differ),
               "start_s": round(res["start_s"], 2), "wall_s": round(res["wall_s"], 2), "solves_per_s": round(len(jobs) / res["wall_s"], 3),
               "peak_rss_mb": round(res["peak_mb"], 1),
               "peak_rss_sum_mb": "" if mode == "threads" else round(res["peak_sum_mb"], 1),
               "baseline_rss_mb": round(res["baseline_mb"], 1), "load1": round(load, 2),
               "which": "; ".join([f"{j[0].rsplit('/', 1)[-1]}:{j[1]} {k[0]} vs serial {serial[tuple(j)][0]}, objective "
                                   f"{'equal' if k[1] == serial[tuple(j)][1] else f'{k[1]!r} vs {serial[tuple(j)][1]!r}'}"
                                   for j, k in differ] + sorted(set(errors)))}
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    _table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    buf.write(f"# command: {command}\n# jobs: {len(jobs)} = examples {args.examples} x backends {args.backends} x reps "
              f"{args.reps}; time limit: {args.time_limit or 'the examples own'}\n# machine load (1/5/15 min) before {load0}, after {os.getloadavg()}; "
              f"{os.cpu_count()} CPUs; load1 per row at its start\n"
              "# peak_rss_mb: threads: the process; processes: the largest worker. peak_rss_sum_mb: the n largest "
              "per-job worker peaks (an upper bound on the pool's total). baseline: the interpreter with torch and "
              "qsync_opt imported\n")
    buf.write("# which: the jobs that erred or whose plan differs from the serial one, and how\n")
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    (args.out / "concurrency.csv").write_text(buf.getvalue())
    print(f"wrote {args.out / 'concurrency.csv'}")
    return 0 if all(r["errors"] == 0 and r["differ_from_serial"] == 0 for r in rows) else 1


def _table(rows: list[dict]) -> None:
    cols = ["mode", "workers", "solves", "errors", "differ_from_serial", "solves_per_s", "peak_rss_mb", "peak_rss_sum_mb",
            "baseline_rss_mb", "load1"]
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(c.rjust(width[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r[c]).rjust(width[c]) for c in cols))


if __name__ == "__main__":
    sys.exit(main())
