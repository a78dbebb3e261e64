"""Does Σω order perplexity? Serving plans of a trained byte-level Llama at many quality bounds, measured.

    PYTHONPATH=$PWD python benchmarks/serving_quality.py --out DIR [--layers 4] [--steps 240] [--bounds 12] [--windows 600]

Trains (once, cached in DIR/model) a byte-level transformers Llama on pysource with the training kind
(benchmarks/serving_model.py), then writes its LLM-PQ calibration statistics (DIR/stats_llmpq.yaml) and its
empirical indicator (DIR/empirical.yaml), both measured on the pysource *training* split. For each indicator
the planner can use — data-free Σω, calibrated Σω, empirical — it plans with `--bounds` values of
serving.quality.max_indicator spread geometrically between the least non-zero and the all-lowest-bit Σω,
and scores every distinct plan's served (quantised) model on the pysource *test* split (`--windows` windows
of prompt_len + gen_tokens = 64 bytes): perplexity and its increase over the all-16-bit served model, beside
the plan's Σω under all three indicators. The baselines (uniform, pipeedge, adabits) and the uniform 16-bit
and lowest-bit models are scored too.

Writes DIR/serving_quality.csv (one row per plan and baseline) and DIR/serving_quality_spearman.csv (the
Spearman rank correlation, ties averaged, of each indicator's Σω with the perplexity increase over the distinct
bit assignments, and over those with a layer below 8 bits: 8-bit layers change perplexity by about 1e-3 either
way, an order no indicator can be asked to predict), with the command and the machine load in header comments.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from results_table import write_table  # noqa: E402

from qsync_opt.errors import InfeasibleError  # noqa: E402
from qsync_opt.jobs import load_spec, solve  # noqa: E402
from qsync_opt.serving import quality_measured as qm  # noqa: E402
from qsync_opt.serving import weights  # noqa: E402
from qsync_opt.serving.quality import layer_omegas  # noqa: E402
from serving_model import serving_spec, trained_llama  # noqa: E402

INDICATORS = {"data-free": {}, "calibrated": {"stats": "STATS"}, "empirical": {"stats": "EMPIRICAL", "indicator": "empirical"}}
"""serving.quality settings of each indicator (STATS / EMPIRICAL: the files this script writes)."""
FIELDS = ["planned_with", "policy", "max_indicator", "bits", "sigma_data_free", "sigma_calibrated", "sigma_empirical",
          "perplexity", "ppl_increase", "predicted_tokens_per_s", "load1"]


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's ρ: Pearson's correlation of the ranks, tied values given their mean rank (nan if either is constant)."""
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def bounds_between(lo: float, hi: float, n: int) -> list[float]:
    """`n` bounds from lo to hi, geometrically spaced (Σω spans orders of magnitude across bit-widths)."""
    if n == 1:
        return [hi]
    return [lo * (hi / lo) ** (k / (n - 1)) for k in range(n)]


def run(out: Path, layers: int, steps: int, n_bounds: int, windows: int, calib_windows: int) -> tuple[list[dict], list[dict]]:
    torch.set_num_threads(1)
    ckpt = trained_llama(out / "model", layers=layers, steps=steps) if steps > 0 else None  # 0: random weights
    base = serving_spec(ckpt, layers=layers, windows=windows)
    job = load_spec(base)
    s = job.serving
    window = s.prompt_len + s.gen_tokens
    model = weights.build(weights.ModelSource("llama", weights.family_config(s.model, "llama"),
                                              None if ckpt is None else str(ckpt), 0))
    test = qm.text_tokens(job)
    train = qm.text_tokens(job, calib_windows, split="train")
    t = time.perf_counter()
    files = {"STATS": str(qm.write_stats(qm.calibration_stats(model, train, window), out / "stats_llmpq.yaml")),
             "EMPIRICAL": str(qm.write_empirical(job, model, out / "empirical.yaml", tokens=train))}
    print(f"calibration statistics and empirical indicator on {calib_windows} training windows: "
          f"{time.perf_counter() - t:.1f} s (load {os.getloadavg()[0]:.2f})", flush=True)
    quality = {name: {k: files.get(v, v) for k, v in q.items()} for name, q in INDICATORS.items()}
    omegas = {name: layer_omegas(s.model, list(s.bits), q.get("stats"), q.get("indicator", "llm-pq"))[0]
              for name, q in quality.items()}
    cache: dict[tuple, float] = {}

    def ppl(bits: tuple) -> float:
        if bits not in cache:
            cache[bits] = qm.bits_perplexity(model, list(bits), test, window, windows=windows, group=s.runtime.group_size)
        return cache[bits]

    ref = ppl((16,) * layers)
    rows = []

    def row(planned_with, policy, bound, bits, tps):
        sig = {name: sum(om[i][b] for i, b in enumerate(bits)) for name, om in omegas.items()}
        p = ppl(tuple(bits))
        rows.append(dict(planned_with=planned_with, policy=policy, max_indicator="" if bound is None else f"{bound:.6g}",
                         bits="/".join(map(str, bits)), sigma_data_free=f"{sig['data-free']:.6g}",
                         sigma_calibrated=f"{sig['calibrated']:.6g}", sigma_empirical=f"{sig['empirical']:.6g}",
                         perplexity=f"{p:.5f}", ppl_increase=f"{p - ref:.5f}",
                         predicted_tokens_per_s="" if tps is None else f"{tps:.1f}", load1=f"{os.getloadavg()[0]:.2f}"))
        r = rows[-1]
        print(f"{planned_with:10s} {policy:9s} bound {r['max_indicator']:>10s}  bits {r['bits']:12s} Σω data-free "
              f"{r['sigma_data_free']:>9s} calibrated {r['sigma_calibrated']:>9s} empirical {r['sigma_empirical']:>9s}  "
              f"ppl {r['perplexity']} (+{r['ppl_increase']})  load {r['load1']}", flush=True)

    low = min(s.bits)
    for name, q in quality.items():
        om = omegas[name]
        least = min(o[b] for o in om for b in s.bits if o[b] > 0)
        top = sum(o[low] for o in om)
        spec_q = copy.deepcopy(base)
        spec_q["serving"]["quality"] = dict(q)
        job_q = load_spec(spec_q)
        plan = solve(spec_q)  # the default bound: no worse than the uniform baseline
        for rec in qm.plan_perplexities(job_q, plan, model, test):
            if rec.policy != "plan":
                tps = next((b.prediction.tokens_per_s for b in plan.baselines if b.name == rec.policy and b.prediction), None)
                row(name, rec.policy, None, rec.bits, tps)
        for bound in bounds_between(least * (1 - 1e-9), top * (1 + 1e-9), n_bounds):
            spec_q["serving"]["quality"]["max_indicator"] = bound
            try:
                plan = solve(spec_q)
            except InfeasibleError as e:
                print(f"{name}: bound {bound:.6g} infeasible: {e}", file=sys.stderr)
                continue
            bits = [b for st in plan.stages for b in st.bits]
            row(name, "plan", bound, bits, plan.prediction.tokens_per_s)
    distinct: dict[str, dict] = {}
    for r in rows:
        distinct.setdefault(r["bits"], r)
    every = list(distinct.values())
    below = [r for r in every if min(int(b) for b in r["bits"].split("/")) < 8]  # 8-bit changes are ±1e-3: jitter
    corr = []
    for name, k in (("data-free", "data_free"), ("calibrated", "calibrated"), ("empirical", "empirical")):
        rho = [spearman([float(r[f"sigma_{k}"]) for r in sel], [float(r["ppl_increase"]) for r in sel])
               for sel in (every, below)]
        corr.append(dict(indicator=name, spearman=f"{rho[0]:.4f}", assignments=len(every),
                         spearman_below_8bit=f"{rho[1]:.4f}", assignments_below_8bit=len(below)))
    return rows, corr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the trained model (cached), the statistics and the CSVs")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of the trained Llama (≥ 4)")
    ap.add_argument("--steps", type=int, default=240, help="training steps")
    ap.add_argument("--bounds", type=int, default=12, help="quality bounds planned per indicator (≥ 10 for the figure)")
    ap.add_argument("--windows", type=int, default=600, help="test-split windows of 64 bytes scored per plan")
    ap.add_argument("--calib-windows", type=int, default=256, help="training-split windows for the statistics")
    ap.add_argument("--smoke", action="store_true", help="smallest end-to-end run (tests): random weights (no training), 3 bounds, 8 windows")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.bounds, args.windows, args.calib_windows = 0, 3, 8, 8
    out = Path(args.out)
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    rows, corr = run(out, args.layers, args.steps, args.bounds, args.windows, args.calib_windows)
    print()
    for c in corr:
        print(f"Spearman ρ(Σω {c['indicator']}, perplexity increase) = {c['spearman']} over {c['assignments']} distinct bit "
              f"assignments, {c['spearman_below_8bit']} over the {c['assignments_below_8bit']} with a layer below 8 bits")
    print(f"load average at start {load0}, at end {os.getloadavg()}, total {time.perf_counter() - t0:.1f} s")
    argv = sys.argv[1:] if argv is None else argv
    for name, data, fields in (("serving_quality.csv", rows, FIELDS),
                               ("serving_quality_spearman.csv", corr, ["indicator", "spearman", "assignments", "spearman_below_8bit",
                                                                "assignments_below_8bit"])):
        print(f"wrote {write_table(out / name, 'serving_quality.py', argv, fields, data, load0[0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
