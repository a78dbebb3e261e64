"""Summarise an accuracy.csv of benchmarks/accuracy.py and check it against the issue's targets.

    python benchmarks/accuracy_summary.py benchmarks/results/accuracy.csv [--metric=test_accuracy_tail] [--out DIR]

Per (task, cluster, setting, policy): test accuracy mean ± std over the seeds present, the
predicted iteration time and the indicator. Then, per (task, cluster, setting): whether
uniform-lowest loses at least 3x the seed std against fp32; if so, the share of that gap the
ILP plan recovers and its predicted time against uniform-lowest's; and whether the ILP plan is
less accurate than either greedy beyond seed noise (the larger of the two stds). With --out, also
writes DIR/accuracy_summary.csv (one row per policy, its group's verdict beside it).
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load(path):
    lines = [x for x in open(path).read().splitlines() if not x.startswith("#")]
    return list(csv.DictReader(lines))


def summary(rows, metric: str = "test_accuracy"):
    acc = defaultdict(list)
    meta = {}
    for r in rows:
        k = (r["task"], r["cluster"], r["setting"], r["policy"])
        meta.setdefault(k, r)
        if r.get(metric):
            acc[k].append(100 * float(r[metric]))
    out = {}
    for k, r in meta.items():
        a = acc.get(k, [])
        out[k] = dict(n=len(a), mean=statistics.mean(a) if a else None, std=statistics.stdev(a) if len(a) > 1 else None,
                      ms=float(r["predicted_ms"]) if r["predicted_ms"] else None,
                      ind=float(r["indicator"]) if r["indicator"] else None, t4=r["t4_precisions"])
    return out


def paired(rows, a: str, b: str, metric: str = "test_accuracy") -> dict[tuple, dict]:
    """Per (task, cluster, setting): policy a minus policy b, seed by seed (same seed, same data order
    and initial weights), as mean ± std over the seeds both finished. A secondary reading: the
    issue's targets are judged on the unpaired means and stds (verdict)."""
    acc = defaultdict(dict)
    for r in rows:
        if r.get(metric):
            acc[(r["task"], r["cluster"], r["setting"], r["policy"])][int(r["seed"])] = 100 * float(r[metric])
    out = {}
    for key in sorted({k[:3] for k in acc}):
        x, y = acc.get((*key, a), {}), acc.get((*key, b), {})
        d = [x[s] - y[s] for s in sorted(set(x) & set(y))]
        if d:
            out[key] = dict(n=len(d), mean=statistics.mean(d), std=statistics.stdev(d) if len(d) > 1 else None, diffs=d)
    return out


def main(path, metric="test_accuracy", out=None):
    """Print the summary of accuracy CSV `path`; with `out` (a folder) also write out/accuracy_summary.csv."""
    rows = load(path)
    s = summary(rows, metric)
    if out is not None:
        write_summary(Path(out) / "accuracy_summary.csv", s, path, metric)
    print(f"metric: {metric}")
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    print("| task | cluster | setting | policy | test accuracy % (mean ± std, n) | predicted ms | indicator | T4 precisions |")
    print("|---|---|---|---|---|---|---|---|")
    for (t, c, st, p), v in s.items():
        print(f"| {t} | {c} | {st} | {p} | {f(v['mean'], '.2f')} ± {f(v['std'], '.2f')} (n={v['n']}) | "
              f"{f(v['ms'], '.3f')} | {f(v['ind'], '.3g')} | {v['t4']} |")
    print()
    for t, c, st in sorted({k[:3] for k in s}):
        print(f"{t} {c} {st}: " + describe(verdict({p: s.get((t, c, st, p)) for p in POLICIES})))
    print("\npaired by seed (a - b, points: mean ± std [per seed]):")
    for a, b in (("fp32", "uniform-lowest"), ("ilp", "uniform-lowest"), ("ilp", "greedy"), ("ilp", "qsync-greedy")):
        for (t, c, st), v in paired(rows, a, b, metric).items():
            sd = "-" if v["std"] is None else f"{v['std']:.2f}"
            print(f"  {t} {c} {st}: {a} - {b} = {v['mean']:+.2f} ± {sd} (n={v['n']}) "
                  f"[{', '.join(f'{x:+.1f}' for x in v['diffs'])}]")


POLICIES = ("fp32", "uniform-lowest", "ilp", "greedy", "qsync-greedy")


def write_summary(path: Path, s: dict, source, metric: str) -> Path:
    """One row per (task, cluster, setting, policy) of summary `s`, with its group's verdict; atomic."""
    from qsync_opt.io import atomic_write_text

    buf = io.StringIO()
    buf.write(f"# summary of {source}, metric {metric}: accuracy in %, mean and std over the seeds finished\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["task", "cluster", "setting", "policy", "seeds", "mean", "std", "predicted_ms", "indicator",
                "t4_precisions", "verdict"])
    for (t, c, st, p), v in s.items():
        fmt = lambda x: "" if x is None else round(x, 4)  # noqa: E731
        w.writerow([t, c, st, p, v["n"], fmt(v["mean"]), fmt(v["std"]), fmt(v["ms"]), "" if v["ind"] is None else v["ind"],
                    v["t4"], describe(verdict({q: s.get((t, c, st, q)) for q in POLICIES}))])
    atomic_write_text(path, buf.getvalue())
    print(f"wrote {path}")
    return path


def verdict(g: dict) -> dict | None:
    """The issue's targets for one (task, cluster, setting), from its per-policy summaries.

    noise: the larger seed std of fp32 and uniform-lowest; hurts: the fp32 - uniform-lowest gap
    is at least 3x that noise; recovered: the share of the gap the ILP plan wins back;
    time_ratio: the ILP's predicted iteration time over uniform-lowest's (target <= 1.05);
    vs_<greedy>: (ILP - greedy accuracy, the noise it is judged against: the larger of the two stds).
    """
    if not all(g.get(p) and g[p]["mean"] is not None for p in ("fp32", "uniform-lowest", "ilp")):
        return None
    noise = max(g[p]["std"] or 0.0 for p in ("fp32", "uniform-lowest"))
    gap = g["fp32"]["mean"] - g["uniform-lowest"]["mean"]
    out = {"gap": gap, "noise": noise, "hurts": bool(noise) and gap >= 3 * noise}
    if gap > 0:
        out["recovered"] = (g["ilp"]["mean"] - g["uniform-lowest"]["mean"]) / gap
    if g["ilp"]["ms"] and g["uniform-lowest"]["ms"]:
        out["time_ratio"] = g["ilp"]["ms"] / g["uniform-lowest"]["ms"]
    for gr in ("greedy", "qsync-greedy"):
        if g.get(gr) and g[gr]["mean"] is not None:
            out[f"vs_{gr}"] = (g["ilp"]["mean"] - g[gr]["mean"], max(g["ilp"]["std"] or 0.0, g[gr]["std"] or 0.0))
    return out


def describe(v: dict | None) -> str:
    if v is None:
        return "not enough finished runs"
    line = f"fp32 - uniform-lowest = {v['gap']:+.2f} points (seed std {v['noise']:.2f})"
    if v["hurts"]:
        line += "; uniform-lowest genuinely hurts"
    else:
        line += "; uniform-lowest does not lose 3x the seed std here"
    if v["hurts"] and "recovered" in v:
        line += f"; ILP recovers {100 * v['recovered']:.0f}% of the gap (target >= 50%)"
    if "time_ratio" in v:
        line += f" at {v['time_ratio']:.3f}x uniform-lowest's predicted time (target <= 1.05)"
    for gr in ("greedy", "qsync-greedy"):
        if f"vs_{gr}" in v:
            d, tol = v[f"vs_{gr}"]
            word = "ILP ahead beyond" if d > tol else "within" if d >= -tol else "ILP behind BEYOND"
            line += f"; ILP - {gr} = {d:+.2f} ({word} noise {tol:.2f})"
    return line


def cli(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", default=str(RESULTS / "accuracy.csv"),
                    help="an accuracy.csv of benchmarks/accuracy.py (default: benchmarks/results/accuracy.csv)")
    ap.add_argument("--metric", default="test_accuracy", help="the column summarised (e.g. test_accuracy_tail)")
    ap.add_argument("--out", help="folder for accuracy_summary.csv (default: print only)")
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): the default input, read only; needs --out")
    a = ap.parse_args(argv)
    if a.smoke and not a.out:
        ap.error("--smoke needs --out DIR: a smoke run writes only there")
    if not Path(a.path).is_file():
        ap.error(f"{a.path}: no such file; give an accuracy.csv written by benchmarks/accuracy.py")
    main(a.path, a.metric, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
