"""Summarise an accuracy.csv of benchmarks/accuracy.py and check it against the issue's targets.

    python benchmarks/accuracy_summary.py benchmarks/results/accuracy.csv

Per (task, cluster, setting, policy): test accuracy mean ± std over the seeds present, the
predicted iteration time and the indicator. Then, per (task, cluster, setting): whether
uniform-lowest loses at least 3x the seed std against fp32; if so, the share of that gap the
ILP plan recovers and its predicted time against uniform-lowest's; and whether the ILP plan is
less accurate than either greedy beyond seed noise (the larger of the two stds).
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict


def load(path):
    lines = [x for x in open(path).read().splitlines() if not x.startswith("#")]
    return list(csv.DictReader(lines))


def summary(rows):
    acc = defaultdict(list)
    meta = {}
    for r in rows:
        k = (r["task"], r["cluster"], r["setting"], r["policy"])
        meta.setdefault(k, r)
        if r["test_accuracy"]:
            acc[k].append(100 * float(r["test_accuracy"]))
    out = {}
    for k, r in meta.items():
        a = acc.get(k, [])
        out[k] = dict(n=len(a), mean=statistics.mean(a) if a else None, std=statistics.stdev(a) if len(a) > 1 else None,
                      ms=float(r["predicted_ms"]) if r["predicted_ms"] else None,
                      ind=float(r["indicator"]) if r["indicator"] else None, t4=r["t4_precisions"])
    return out


def main(path):
    s = summary(load(path))
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    print(f"| task | cluster | setting | policy | test accuracy % (mean ± std, n) | predicted ms | indicator | T4 precisions |")
    print("|---|---|---|---|---|---|---|---|")
    for (t, c, st, p), v in s.items():
        print(f"| {t} | {c} | {st} | {p} | {f(v['mean'], '.2f')} ± {f(v['std'], '.2f')} (n={v['n']}) | "
              f"{f(v['ms'], '.3f')} | {f(v['ind'], '.3g')} | {v['t4']} |")
    print()
    settings = sorted({k[:3] for k in s})
    for t, c, st in settings:
        g = {p: s.get((t, c, st, p)) for p in ("fp32", "uniform-lowest", "ilp", "greedy", "qsync-greedy")}
        if not all(g[p] and g[p]["mean"] is not None for p in ("fp32", "uniform-lowest", "ilp")):
            print(f"{t} {c} {st}: not enough finished runs")
            continue
        noise = max(x["std"] or 0.0 for x in (g["fp32"], g["uniform-lowest"]))
        gap = g["fp32"]["mean"] - g["uniform-lowest"]["mean"]
        line = f"{t} {c} {st}: fp32 - uniform-lowest = {gap:+.2f} points (seed std {noise:.2f})"
        if noise and gap >= 3 * noise:
            rec = (g["ilp"]["mean"] - g["uniform-lowest"]["mean"]) / gap
            line += (f"; uniform-lowest genuinely hurts: ILP recovers {100 * rec:.0f}% of the gap (target >= 50%) at "
                     f"{g['ilp']['ms']:.3f} ms vs uniform-lowest {g['uniform-lowest']['ms']:.3f} ms (target within 5%)")
        else:
            line += "; uniform-lowest does not lose 3x the seed std here"
        for gr in ("greedy", "qsync-greedy"):
            if g[gr] and g[gr]["mean"] is not None:
                tol = max(g["ilp"]["std"] or 0.0, g[gr]["std"] or 0.0)
                d = g["ilp"]["mean"] - g[gr]["mean"]
                line += f"; ILP - {gr} = {d:+.2f} ({'within' if d >= -tol else 'BEYOND'} noise {tol:.2f})"
        print(line)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/accuracy.csv")
