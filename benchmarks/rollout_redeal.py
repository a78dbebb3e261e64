"""How much placing a run's in-flight sequences by their contexts could raise the rollouts' decode rate.

A decode step of b sequences whose contexts sum to S costs decode_ms(b, S): a long context slows every sequence
batched with it. For one simulated run of each case (repack-best-fit, the case's seed and η, at the given decode-batch
cap), at every `--every`-th KV sample the in-flight sequences are taken as they are, and their decode rate
(Σ over rollouts of b / decode_ms(b, S)) is set against two re-deals of the same sequences over the same rollouts,
ignoring what moving them would cost: dealt evenly by context, and the best of the segregated deals (the longest
`frac` of the contexts over `m` rollouts, the rest over the others, each within its KV capacity and batch cap). One
worker kind per case (the re-deal prices every rollout alike).

    PYTHONPATH=. python benchmarks/rollout_redeal.py --out DIR [--cases a100x64:48 h100x64-verl128:192]
        [--sim-steps 50] [--every 10] [--smoke]

Writes DIR/rollout_redeal.csv. Deterministic (figures do not depend on the machine or its load).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_table import load_now, write_table  # noqa: E402
from benchmarks.rollout import case_caps, case_job  # noqa: E402
from qsync_opt.rollout.admission import with_cap  # noqa: E402
from qsync_opt.rollout.simulate import Simulator  # noqa: E402

COLS = ("case", "batch_cap", "steps", "snapshots", "in_flight_mean", "rate_now_mean", "rate_even_mean",
        "rate_segregated_mean", "segregated_over_now_mean", "segregated_over_now_max")
FRACS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4)
"""Shares of the longest contexts the segregated deals put apart."""


def rate(c, groups) -> float:
    """Tokens per ms of rollouts decoding `groups` (one array of contexts each) at the cost model `c`."""
    return sum(len(g) / c.decode_ms(len(g), float(g.sum())) for g in groups if len(g))


def deal(ctx: np.ndarray, n: int) -> list[np.ndarray]:
    """`ctx` (sorted, longest first) dealt round-robin over n rollouts: each gets an even share of every length."""
    return [ctx[i::n] for i in range(n)]


def redeal(c, cap: int, ctx: np.ndarray, workers: int) -> tuple[float, float]:
    """(even deal's rate, best segregated deal's rate) of the contexts `ctx` over `workers` rollouts of cost `c`."""
    ctx = np.sort(ctx)[::-1]
    even = rate(c, deal(ctx, workers))
    best = even
    for m in range(1, workers // 2 + 1):
        for frac in FRACS:
            k = int(len(ctx) * frac)
            if k < m:
                continue
            groups = deal(ctx[:k], m) + deal(ctx[k:], workers - m)
            if any(len(g) > cap or g.sum() > c.kv_capacity_tokens for g in groups):
                continue
            best = max(best, rate(c, groups))
    return even, best


class Snapshots(Simulator):
    """The simulator, keeping (in flight, rate now, even, segregated) of its in-flight sequences every `every`-th KV
    sample."""

    def __init__(self, job, variant: str, every: int):
        super().__init__(job, variant)
        self.every, self.samples, self.snaps = every, 0, []

    def _sample_kv(self):
        super()._sample_kv()
        self.samples += 1
        if self.samples % self.every:
            return
        groups = []
        for w in self.workers:
            k = self._steps_now(w)
            groups.append(np.array([t.prompt + t.gen_base + (k - t.start_step) for t in w.batch.values()], float))
        ctx = np.concatenate(groups)
        if len(ctx) < 2:
            return
        c = self.workers[0].c
        even, seg = redeal(c, self.cap, ctx, len(self.workers))
        self.snaps.append((len(ctx), rate(c, groups), even, seg))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="*", default=["a100x64:48", "h100x64-verl128:192"],
                    help="case:cap of benchmarks/rollout.py, one worker kind each (default: the two one-kind η = 1 "
                         "cases more than 5%% under the ceiling, at the caps the planner chooses)")
    ap.add_argument("--sim-steps", type=int, default=50, help="trainer steps simulated")
    ap.add_argument("--every", type=int, default=10, help="a snapshot every this many KV samples")
    ap.add_argument("--smoke", action="store_true", help="smallest end-to-end run (tests): h100x128:64, 1 step")
    args = ap.parse_args(argv)
    if args.smoke:
        args.cases, args.sim_steps, args.every = ["h100x128:64"], 1, 5
    cases = case_caps(ap, args.cases, one_kind="the re-deal prices every rollout alike")
    load0 = load_now()
    rows = []
    print(f"in-flight sequences re-dealt by context (repack-best-fit, {args.sim_steps} steps, tokens per ms, "
          f"before any migration cost)")
    for name, cap in cases:
        sim = Snapshots(with_cap(case_job(name, args.sim_steps), cap), "repack-best-fit", args.every)
        sim.run()
        snaps = np.array(sim.snaps, dtype=float).reshape(-1, 4)
        if not len(snaps):
            print(f"{name} (cap {cap}): no snapshot with sequences in flight")
            continue
        gain = snaps[:, 3] / snaps[:, 1]
        row = {"case": name, "batch_cap": cap, "steps": args.sim_steps, "snapshots": len(snaps),
               "in_flight_mean": round(float(snaps[:, 0].mean()), 1),
               "rate_now_mean": round(float(snaps[:, 1].mean()), 3),
               "rate_even_mean": round(float(snaps[:, 2].mean()), 3),
               "rate_segregated_mean": round(float(snaps[:, 3].mean()), 3),
               "segregated_over_now_mean": round(float(gain.mean()), 4),
               "segregated_over_now_max": round(float(gain.max()), 4)}
        rows.append(row)
        print(f"{name} (cap {cap}): {len(snaps)} snapshots, {row['in_flight_mean']:.0f} sequences in flight; "
              f"decode rate now {row['rate_now_mean']:.1f}, dealt evenly {row['rate_even_mean']:.1f}, best segregated "
              f"{row['rate_segregated_mean']:.1f}: {gain.mean():.3f}x now on average, at most {gain.max():.3f}x")
    path = write_table(Path(args.out) / "rollout_redeal.csv", "rollout_redeal.py",
                       argv if argv is not None else sys.argv[1:], COLS, rows, load0)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
