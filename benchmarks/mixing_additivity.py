"""Does a mixed-precision plan cost what its parts cost? The replayer's linear form, checked.

The replayer prices a plan as the sum of its ops' in-step costs at their formats. If mixing
formats cost extra (or less) beyond that, mixed plans would be mispredicted however good
the profile. Model-free check in one process, four plans interleaved over `--rounds`:
uniform fp32 (U32), uniform LOW (ULow), and two mixed plans A and B that lower
complementary halves of the selectable ops (`alt`: every other op; `halves`: the first
half / the second). Additive costs give A + B = U32 + ULow exactly, whatever each op costs;
the ratio (A + B) / (U32 + ULow) per round, and its median, say how far from that.

    PYTHONPATH=. python benchmarks/mixing_additivity.py --out DIR [--model tiny-resnet] [--rounds 10]

Writes DIR/mixing_additivity.csv (command and machine load in its header); prints the table.
Each plan's step is the trainer's loop body (step_profile.loop_step), read as `train` reads
it (median of 20 steps after 3 warm-ups), 1 thread.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from qsync_opt.io import atomic_write_text  # noqa: E402


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def plans(ops: list[str], low: str, split: str) -> dict[str, dict[str, str]]:
    half = set(ops[0::2]) if split == "alt" else set(ops[: len(ops) // 2])
    return {"U32": {o: "fp32" for o in ops}, "ULow": {o: low for o in ops},
            "A": {o: (low if o in half else "fp32") for o in ops},
            "B": {o: ("fp32" if o in half else low) for o in ops}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="tiny-resnet", help="a zoo model")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--lows", default="bf16,int8")
    ap.add_argument("--splits", default="alt,halves")
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): tiny-cnn, batch 2, int8 lowered alternately, 1 round")
    a = ap.parse_args(argv)
    if a.smoke:
        a.model, a.batch, a.rounds, a.lows, a.splits = "tiny-cnn", 2, 1, "int8", "alt"
    from qsync_opt.models.from_spec import build_from_spec
    from qsync_opt.training.pipeline import prepare
    from qsync_opt.training.predictor.step_profile import loop_step, step_median_ms
    from qsync_opt.runtime.apply import apply_plan
    from qsync_opt.training.runtime.trainer import make_optimizer
    from qsync_opt.training.spec import load_spec

    torch.set_num_threads(1)
    raw = {"name": "additivity", "model": {"name": a.model}, "runtime": {"boundary": "fp32"}, "costs": "roofline",
           "training": {"global_batch": a.batch, "optimizer": "adam"}, "objective": {"max_iteration_time": 1e9},
           "cluster": {"groups": [{"name": "native", "device": "cpu-local"}], "interconnect": "loopback"}}
    spec = load_spec(raw)
    ops = [n.name for n in prepare(spec).graph.selectable]

    def step_of(plan):
        torch.manual_seed(spec.training.seed)
        model = apply_plan(build_from_spec(spec).train(), plan)
        return loop_step(spec, 0, model, make_optimizer(spec.training, [p for p in model.parameters() if p.requires_grad]))

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=. python benchmarks/mixing_additivity.py " + " ".join(sys.argv[1:] if argv is None else argv)
    t0, load0, rows = time.time(), load(), []
    print(f"{'low':5} {'split':7} {'U32':>7} {'ULow':>7} {'A':>7} {'B':>7} {'(A+B)/(U32+ULow) median':>24} {'rounds range':>14}  load")
    for low in a.lows.split(","):
        for split in a.splits.split(","):
            steps = {k: step_of(p) for k, p in plans(ops, low, split).items()}
            got = {k: [] for k in steps}
            for _ in range(a.rounds):  # interleaved: slow drift of the machine hits every plan alike
                for k, s in steps.items():
                    got[k].append(step_median_ms(s, calls=20))
            ratios = [(x + y) / (u + v) for x, y, u, v in zip(got["A"], got["B"], got["U32"], got["ULow"])]
            med = {k: statistics.median(v) for k, v in got.items()}
            row = {"model": a.model, "low": low, "split": split, "ops": len(ops),
                   **{f"{k}_ms": round(v, 3) for k, v in med.items()},
                   "ratio_median": round(statistics.median(ratios), 4), "ratio_min": round(min(ratios), 4),
                   "ratio_max": round(max(ratios), 4), "load": load()}
            rows.append(row)
            print(f"{low:5} {split:7} {row['U32_ms']:7.2f} {row['ULow_ms']:7.2f} {row['A_ms']:7.2f} {row['B_ms']:7.2f} "
                  f"{row['ratio_median']:24.3f} {row['ratio_min']:6.2f}-{row['ratio_max']:<6.2f}  {row['load']}", flush=True)
    buf = io.StringIO()
    buf.write(f"# command: {command}\n# machine load (1/5/15 min) at start {load0}, at end {load()}; "
              f"wall {time.time() - t0:.0f} s; torch {torch.__version__}; 1 thread\n")
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(out / "mixing_additivity.csv", buf.getvalue())
    print(f"wrote {out / 'mixing_additivity.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
