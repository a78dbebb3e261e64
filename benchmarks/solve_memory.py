"""Peak memory and wall time of one `qsync_opt.solve`, this tree against another revision, side by side.

    PYTHONPATH=$PWD python benchmarks/solve_memory.py --out DIR [--compare REV] [--reps 3]
        [--examples examples/hybrid_v100_t4_resnet50.yaml,examples/hybrid_a100_t4_bert_base.yaml]

Every measurement is one fresh Python process: import torch and qsync_opt, read the resident
set (the baseline: the interpreter with torch imported), call solve once, read the peak
resident set (VmHWM), the wall time of the call and its CPU time (all threads; steadier than
wall time on a loaded machine). The two versions alternate within each
repetition so that both see the same machine load. Prints the medians and writes
DIR/solve_memory.csv (every reading; the command and the machine load in its header).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("examples/hybrid_v100_t4_resnet50.yaml", "examples/hybrid_a100_t4_bert_base.yaml")
PROBE = r"""
import json, sys, time
from pathlib import Path
def rss(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
import importlib, torch, qsync_opt
here = Path(qsync_opt.__file__).parent  # the layout moved the pipeline (issue 18): import the tree's own, never the other's
importlib.import_module("qsync_opt.training.pipeline" if (here / "training" / "pipeline.py").exists() else "qsync_opt.pipeline")
base = rss("VmRSS")
t0, c0 = time.perf_counter(), time.process_time()
p = qsync_opt.solve(sys.argv[1])
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"solve_s": wall, "solve_cpu_s": cpu, "code": qsync_opt.__file__, "baseline_mb": base, "peak_mb": rss("VmHWM"), "status": p.solver.status,
                  "objective": p.solver.objective, "notes": [n for n in p.solver.notes if n.startswith("build ")]}))
"""


def _checkout(rev: str, into: Path) -> Path:
    """`rev`'s qsync_opt package, extracted under `into` (git archive: no worktree touched)."""
    data = subprocess.run(["git", "archive", rev, "qsync_opt"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(code_root: Path, example: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    # cwd = the code's own root: `python -c` puts the working directory first on sys.path
    proc = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / example)], capture_output=True, text=True,
                          env=env, cwd=code_root)
    if proc.returncode != 0:
        raise SystemExit(f"{code_root} {example}: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not Path(out["code"]).resolve().is_relative_to(code_root.resolve()):
        raise SystemExit(f"measured {out['code']}, not the code under {code_root}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", help="a git revision to measure beside this tree (e.g. main)")
    ap.add_argument("--examples", default=",".join(EXAMPLES))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): examples/cpu_tiny.yaml, this tree only, once")
    args = ap.parse_args(argv)
    if args.smoke:
        args.examples, args.reps, args.compare = "examples/cpu_tiny.yaml", 1, None
    command = "PYTHONPATH=$PWD python benchmarks/solve_memory.py " + " ".join(sys.argv[1:] if argv is None else argv)
    load0 = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        versions = [("this tree", ROOT)]
        if args.compare:
            versions.append((args.compare, _checkout(args.compare, Path(tmp))))
        for rep in range(args.reps):
            for example in args.examples.split(","):
                for label, code in (versions if rep % 2 == 0 else versions[::-1]):
                    load = os.getloadavg()[0]
                    r = measure(code, example)
                    row = {"version": label, "example": example, "rep": rep, "solve_s": round(r["solve_s"], 3),
                           "solve_cpu_s": round(r["solve_cpu_s"], 3),
                           "peak_above_baseline_mb": round(r["peak_mb"] - r["baseline_mb"], 1),
                           "peak_mb": round(r["peak_mb"], 1), "baseline_mb": round(r["baseline_mb"], 1),
                           "status": r["status"], "objective": r["objective"], "stages": "; ".join(r["notes"]),
                           "load1": round(load, 2)}
                    rows.append(row)
                    print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    print(f"\nmedians over {args.reps} fresh processes each (load before {load0}, after {os.getloadavg()})")
    print(f"{'example':44s} {'version':>12s} {'solve_s':>8s} {'cpu_s':>6s} {'peak above baseline MB':>23s}  objective")
    for example in args.examples.split(","):
        for label in dict.fromkeys(r["version"] for r in rows):
            mine = [r for r in rows if r["example"] == example and r["version"] == label]
            print(f"{example:44s} {label:>12s} {statistics.median(r['solve_s'] for r in mine):8.2f} "
                  f"{statistics.median(r['solve_cpu_s'] for r in mine):6.2f} "
                  f"{statistics.median(r['peak_above_baseline_mb'] for r in mine):23.1f}  {mine[0]['objective']:.6g}")
    args.out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    buf.write(f"# command: {command}\n# machine load (1/5/15 min) before {load0}, after {os.getloadavg()}; "
              f"{os.cpu_count()} CPUs; load1 per row at its start. baseline: interpreter + torch + qsync_opt imported\n")
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    (args.out / "solve_memory.csv").write_text(buf.getvalue())
    print(f"wrote {args.out / 'solve_memory.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
