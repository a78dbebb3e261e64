"""Per-kind precision on the hybrid rollout fleets (#44 scope 3): each worker kind's weight bit-width varied, every
asynchronous policy and best-fit repack simulated, the proven ceiling under the staleness rule of that fleet beside
them, and the quality indicator of a trajectory generated on each kind.

For each hybrid case of benchmarks/rollout.py (A100 + L4, A100 + T4; same spec, seed, η and steps as
rollout_ceilings.py) and each bit-width assignment of --bits that fits (the spec refuses a kind whose model at b bits
leaves no KV room for a trajectory: that row is printed as refused, not written), the simulator prices decode at b
bits with rollout.costs (the serving cost model, qsync_opt.llm, at b bits) and the plan's quality is LLM-PQ's
data-free indicator (qsync_opt.serving.quality.data_free_omega): a trajectory decoded on a kind at b bits sees
layers × ω(b), 0 at 16 bits. The spec's own assignment is a row like any other (16/8 on A100 + L4, 16/4 on A100 + T4).

    PYTHONPATH=. python benchmarks/rollout_bits.py --out DIR [--cases ...] [--sim-steps 50] [--bits 16/16 16/8 ...]

Writes DIR/rollout_bits.csv. Deterministic (figures do not depend on the machine or its load).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_table import load_now, write_table  # noqa: E402
from benchmarks.rollout import ASYNC, CASES, FIXED_ETA  # noqa: E402
from qsync_opt.errors import SpecError  # noqa: E402
from qsync_opt.rollout.bounds_staleness import staleness_ceiling  # noqa: E402
from qsync_opt.rollout.simulate import simulate  # noqa: E402
from qsync_opt.rollout.spec import load_rollout_spec  # noqa: E402
from qsync_opt.serving.quality import data_free_omega  # noqa: E402

HYBRID = ("a100x64+l4x64", "a100x128+t4x128")
COLS = ("case", "eta", "steps", "bits", "policy", "trajectories_per_s", "ceiling_tps", "of_ceiling",
        "trainer_idle_frac", "rollout_idle_frac", "decode_stretch_mean", "indicator_per_kind")


def bits_job(name: str, steps: int, bits: tuple[int, ...]):
    """Case `name` with its worker groups at `bits` (in the spec's worker order); SpecError if a kind cannot hold it."""
    d = copy.deepcopy(dict(CASES)[name])
    r = d["rollout"]
    r["steps"] = steps
    r["policy"]["eta"] = FIXED_ETA.get(name, 1)
    if len(bits) != len(r["workers"]):
        raise SpecError(f"--bits {'/'.join(map(str, bits))}: case {name} has {len(r['workers'])} worker kinds")
    for w, b in zip(r["workers"], bits):
        w["bits"] = b
    return load_rollout_spec(d)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="*", default=list(HYBRID), choices=HYBRID)
    ap.add_argument("--sim-steps", type=int, default=50)
    ap.add_argument("--bits", nargs="*", default=["16/16", "16/8", "16/4", "16/3"],
                    help="bit-widths per worker kind, in the spec's worker order (strong kind first)")
    ap.add_argument("--smoke", action="store_true", help="smallest end-to-end run (tests): A100 + T4, 1 trainer step")
    args = ap.parse_args(argv)
    if args.smoke:
        args.cases, args.sim_steps, args.bits = ["a100x128+t4x128"], 1, ["16/8", "16/4"]
    try:
        assignments = [tuple(int(x) for x in b.split("/")) for b in args.bits]
    except ValueError:
        ap.error(f"--bits {' '.join(args.bits)}: give each assignment as B/B (integers), e.g. 16/8")
    load0 = load_now()
    rows = []
    for c in args.cases:
        print(f"\n{c}: policy by the weight bit-widths of its worker kinds, {args.sim_steps} trainer steps")
        for bits in assignments:
            tag = "/".join(map(str, bits))
            try:
                job = bits_job(c, args.sim_steps, bits)
            except SpecError as e:
                print(f"  {tag:6s} refused: {str(e).splitlines()[-1].strip()}")
                continue
            cl = staleness_ceiling(job)
            om = data_free_omega(job.rollout.model, list(bits))
            layers = job.rollout.model.get("layers")
            indicator = "/".join(f"{layers * om[b]:.3g}" for b in bits)
            for v in (*ASYNC, "repack-best-fit"):
                r = simulate(job, v)
                print(f"  {tag:6s} {v:17s} {r.trajectories_per_s:7.2f} traj/s  {r.trajectories_per_s / cl.tps:6.1%} of "
                      f"its ceiling ({cl.tps:.2f}, {cl.bound_by})  trainer idle {r.trainer_idle_frac:5.1%}  rollouts "
                      f"idle {r.rollout_idle_frac:5.1%}  tokens {r.decode_stretch_mean:4.2f}x the single step  "
                      f"indicator per kind {indicator}")
                rows.append({"case": c, "eta": cl.eta, "steps": args.sim_steps, "bits": tag, "policy": v,
                             "trajectories_per_s": round(r.trajectories_per_s, 3), "ceiling_tps": round(cl.tps, 3),
                             "of_ceiling": round(r.trajectories_per_s / cl.tps, 4),
                             "trainer_idle_frac": round(r.trainer_idle_frac, 4),
                             "rollout_idle_frac": round(r.rollout_idle_frac, 4),
                             "decode_stretch_mean": round(r.decode_stretch_mean, 4), "indicator_per_kind": indicator})
    path = write_table(Path(args.out) / "rollout_bits.csv", "rollout_bits.py",
                       argv if argv is not None else sys.argv[1:], COLS, rows, load0)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
