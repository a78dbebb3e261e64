"""One fp32 DDP step read three ways, side by side: is the planner's calibration point biased?

A DDP plan's replay is calibrated to one figure, the fp32 DDP step the profile stores
(predictor/allreduce_profile.py). If that reading sat systematically below what `train` then
measures, every plan would be under-predicted alike. Each round reads the same step of the
spec's fp32 plan, back to back:

  profiler  `qsync-opt profile` from an empty profile: the DDP step as the profile stores it
            (until 7d2b9d8 taken in the co-located profiling processes after their profiling; then
            in fresh ranks; since 22e22f6 in the co-located processes before they profile)
  spawned   allreduce_profile.measure_ddp_step: fresh ranks that only take that step
  train     qsync_opt.training.runtime.launch.run_job, `--steps` steps, the median lockstep step
            (run_stages.measured_iteration_ms), as `qsync-opt run` reports it

    PYTHONPATH=. python benchmarks/ddp_step_readings.py --out DIR [--spec examples/cpu_tiny.yaml] [--rounds 4]

Writes DIR/ddp_step_readings.csv (command and machine load in its header) and prints the
table on stdout (the ranks' log lines go to stderr): each reading, and profiler and spawned
relative to train.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qsync_opt.io import atomic_write_text  # noqa: E402


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def read_once(spec, steps: int, tmp: Path) -> dict[str, float]:
    from qsync_opt.training.predictor.allreduce_profile import ddp_key, measure_ddp_step
    from qsync_opt.training.predictor.profiler import profile_spec
    from qsync_opt.training.run_stages import measured_iteration_ms
    from qsync_opt.training.runtime.launch import run_job

    folder = Path(tempfile.mkdtemp(dir=tmp))
    prof = profile_spec(spec, folder / "profile.json", progress=False, log=lambda s: None)
    profiler = prof.allreduce[ddp_key(spec)]["fp32_ms"]
    spawned = measure_ddp_step(spec)
    r = run_job(spec, None, steps=steps, threads=1, metrics_dir=str(folder / "train"), timeout_s=600,
                logs_to_stderr=True)  # stdout: the table
    if not r.ok:
        raise SystemExit(f"training failed: {r.failure or r.returncodes}")
    return {"profiler_ms": profiler, "spawned_ms": spawned, "train_ms": measured_iteration_ms(folder / "train")[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", default=str(ROOT / "examples" / "cpu_tiny.yaml"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30, help="training steps of the train reading (first dropped)")
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): examples/cpu_tiny.yaml in fp32 only, 1 round, 3 training "
                         "steps, the profiler at its fewest calls")
    a = ap.parse_args(argv)
    if a.smoke:
        from _smoke import rough_profiles, tiny_spec

        a.rounds, a.steps = 1, 3
        a.spec = str(tiny_spec(Path(a.out) / "smoke"))
        rough_profiles(Path(a.out) / "smoke" / "profiles")
    from qsync_opt.training.spec import load_spec

    spec = load_spec(a.spec)
    if spec.cluster.world_size < 2:
        ap.error(f"--spec {a.spec}: a single rank has no DDP step; give a spec with 2 or more ranks")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=. python benchmarks/ddp_step_readings.py " + " ".join(sys.argv[1:] if argv is None else argv)
    t0, load0, rows = time.time(), load(), []
    print(f"{'round':>5} {'profiler ms':>11} {'spawned ms':>10} {'train ms':>9} {'profiler/train':>14} "
          f"{'spawned/train':>13}  load")
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            got = read_once(spec, a.steps, Path(tmp))
            row = {"round": r, **{k: round(v, 3) for k, v in got.items()},
                   "profiler_vs_train": round(got["profiler_ms"] / got["train_ms"], 4),
                   "spawned_vs_train": round(got["spawned_ms"] / got["train_ms"], 4), "load": load()}
            rows.append(row)
            print(f"{r:5} {row['profiler_ms']:11.1f} {row['spawned_ms']:10.1f} {row['train_ms']:9.1f} "
                  f"{row['profiler_vs_train']:14.3f} {row['spawned_vs_train']:13.3f}  {row['load']}", flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in ("profiler_vs_train", "spawned_vs_train")}
    print(f"median ratio: profiler/train {med['profiler_vs_train']:.3f}, spawned/train {med['spawned_vs_train']:.3f}")
    buf = io.StringIO()
    buf.write(f"# command: {command}\n# machine load (1/5/15 min) at start {load0}, at end {load()}; "
              f"wall {time.time() - t0:.0f} s; 1 thread per rank\n")
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(out / "ddp_step_readings.csv", buf.getvalue())
    print(f"wrote {out / 'ddp_step_readings.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
