"""Predicted vs measured iteration time, and indicators vs the measured loss change.

    PYTHONPATH=. python benchmarks/predictor.py --out results/predictor [--quick]

Time: for each model, random mixed plans plus uniform fp32 / bf16 / int8, in two modes:
'single' (one process, group native = cpu-local) and 'ddp' (2-rank gloo DDP: native, and
sse41 = cpu-sse41 with ONEDNN_MAX_CPU_ISA=SSE41, oneDNN capped at a level every x86-64 CPU
is above, so older kernels run on any x86 machine). Every process runs 1 thread. The run
alternates, in several rounds, a fresh profile of the runtime's kernels for each mode
(qsync_opt.training.predictor.profiler: one subprocess per group with its env; for 'ddp' both ranks'
profilers at once, as they train, plus one measured fp32 DDP step) and real
training steps of every plan (benchmarks/predictor_worker.py); the profile used for the
prediction is the per-entry median over rounds, the measurement the median over rounds of
each round's median step (blocks x repeats consecutive steps), as the profiler times its whole
steps and as `train` reports iterations (step_profile.step_median_ms).

Noise floor: every plan is measured once per round, each round in a fresh worker process
minutes after the last, as the profile the prediction uses was read in other processes at
other times. `noise_floor_pct` is how much two such windows of one plan disagree:
|a - b| / mean(a, b) over every pair of rounds, the median over all of the model's plans in
that mode (a robust figure: one pair of windows put it anywhere from 0.2% to 37% on this
shared machine). The compared figures are medians over rounds, so a little steadier than one window.
`fp32_windows_pct` is the spread, (max - min) / mean, of the fp32 plan's three readings: the
profiler's (its whole fp32 step; in 'ddp' its one fp32 DDP step) from which uniform fp32 is
predicted, and the worker's at the start and at the end of each round (medians over rounds):
every plan of that mode inherits the calibration point's offset.

Indicators: per model, Spearman rank correlation of weight, GVAR and Hessian ω with the
empirical ω (loss change with one op lowered) over (op, precision) pairs; and, per plan, of
each indicator's sum with the measured loss change of the whole mixed plan.

Writes DIR/predictor.csv, DIR/indicators.csv, DIR/predictor_scatter.png; prints the tables
with the machine load (os.getloadavg) beside them.
"""

from __future__ import annotations

import argparse
import copy
import csv
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from qsync_opt.io import atomic_write_text  # noqa: E402
from qsync_opt.training.predictor.step_profile import STEP_WARMUP  # noqa: E402
from qsync_opt.training.spec import load_spec  # noqa: E402

SSE41_ENV = {"ONEDNN_MAX_CPU_ISA": "SSE41", "OMP_NUM_THREADS": "1"}
ONE = {"OMP_NUM_THREADS": "1"}
PRECS = ("fp32", "bf16", "int8")


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def specs(model: str, batch: int, profile: str | None = None) -> dict[str, dict]:
    extra = {"profile": profile} if profile else {}
    base = {"model": {"name": model}, "runtime": {"boundary": "fp32"}, "costs": "measured" if profile else "auto",
            "objective": {"max_iteration_time": 1e9}}
    single = {**base, "name": f"{model}-single", "training": {"global_batch": batch, "optimizer": "adam"},
              "cluster": {"groups": [{"name": "native", "device": "cpu-local", "env": ONE, "precisions": list(PRECS), **extra}],
                          "interconnect": "loopback"}}
    ddp = {**base, "name": f"{model}-ddp", "training": {"global_batch": 2 * batch, "optimizer": "adam"},
           "cluster": {"groups": [{"name": "native", "device": "cpu-local", "env": ONE, "precisions": list(PRECS), **extra},
                                  {"name": "sse41", "device": "cpu-sse41", "env": SSE41_ENV, **extra}],
                       "interconnect": "loopback"}}
    return {"single": single, "ddp": ddp}


def graph_of(spec: dict):
    from qsync_opt.training.pipeline import prepare

    return prepare(load_spec({**spec, "costs": "roofline"}))


def make_plans(prepared, spec: dict, n_random: int, rng: random.Random) -> list[tuple[str, dict]]:
    s = load_spec(spec)
    ops = [n.name for n in prepared.graph.selectable]
    allowed = {g.name: g.allowed_precisions for g in s.cluster.groups}
    plans = []
    for p in PRECS:
        plans.append((f"uniform-{p}", {g: {op: (p if p in ps else "fp32") for op in ops} for g, ps in allowed.items()}))
    for k in range(n_random):
        plans.append((f"mixed-{k}", {g: {op: rng.choice(ps) for op in ops} for g, ps in allowed.items()}))
    return plans


def measure(spec: dict, plans, job_dir: Path, *, warmup: int, blocks: int, repeats: int) -> dict[str, float]:
    """Real iteration times of `plans`, fp32 timed first and last (the two noise windows)."""
    from qsync_opt.training.runtime.launch import free_port, rank_envs, spawn_ranks

    fp32 = dict(plans)["uniform-fp32"]
    order = [("uniform-fp32", fp32)] + [p for p in plans if p[0] != "uniform-fp32"] + [("uniform-fp32#2", fp32)]
    job = job_dir / f"job-{spec['name']}.json"
    res = job_dir / f"res-{spec['name']}.json"
    res.unlink(missing_ok=True)
    job.write_text(json.dumps({"spec": spec, "plans": order, "warmup": warmup, "blocks": blocks,
                               "repeats": repeats, "out": str(res)}))
    argv = [sys.executable, str(ROOT / "benchmarks" / "predictor_worker.py"), str(job)]
    s = load_spec(spec)
    envs = rank_envs(s, 1, free_port())
    for e in envs:
        e["PYTHONPATH"] = str(ROOT)
    if s.cluster.world_size == 1:
        codes = [subprocess.run(argv, env=envs[0]).returncode]
    else:
        done = spawn_ranks(argv, envs, timeout_s=900)
        codes = done.codes + ([done.failure] if done.failure else [])
    if any(codes) or not res.exists():
        raise RuntimeError(f"measuring {spec['name']} failed: exit codes {codes}")
    return json.loads(res.read_text())


def merge_profiles(paths: list[Path], out: Path) -> None:
    """Per-entry median over the rounds' profiles."""
    from qsync_opt.training.predictor.profile import load_profile

    profs = [load_profile(p) for p in paths]
    merged = copy.deepcopy(profs[0])
    for key, sec in merged.sections.items():
        others = [p.sections[key] for p in profs if key in p.sections]
        for sig in sec.ops:
            vals = [o.ops[sig] for o in others if sig in o.ops]
            sec.ops[sig] = {f: statistics.median(v[f] for v in vals) for f in ("fwd_ms", "bwd_ms")}
        for k in sec.optimizer:
            sec.optimizer[k] = statistics.median(o.optimizer[k] for o in others if k in o.optimizer)
        for k, per in sec.steps.items():
            sec.steps[k] = {p: statistics.median(o.steps[k][p] for o in others if p in o.steps.get(k, {})) for p in per}
    for k in merged.allreduce:
        vals = [p.allreduce[k] for p in profs if k in p.allreduce]
        merged.allreduce[k] = {f: statistics.median(v[f] for v in vals) for f in vals[0]}
    merged.save(out)


def predict(spec: dict, prepared, plans) -> dict[str, float]:
    from qsync_opt.training.predictor.instance_builder import build_instance
    from qsync_opt.training.predictor.replayer import replay

    s = load_spec(spec)
    _, ctx = build_instance(s, prepared.graph, prepared.sensitivity, boundary="fp32")
    bad = [g.name for g in ctx.groups if not g.cost_source.startswith("measured")]
    if bad:
        raise RuntimeError(f"{spec['name']}: groups {bad} not costed from the profile: {[g.cost_source for g in ctx.groups]}")
    return {key: replay(ctx, plan).iteration_ms for key, plan in plans}


def profiled_fp32_ms(spec: dict, prepared, path: Path) -> float:
    """The fp32 plan's step as the profile read it: the one fp32 DDP step with every rank at once
    ('ddp'), or the group's whole fp32 step ('single'); uniform fp32 is predicted from it."""
    from qsync_opt.training.predictor.allreduce_profile import ddp_key
    from qsync_opt.training.predictor.profile import load_profile, runtime_tag
    from qsync_opt.training.predictor.profiler import group_threads, local_ranks
    from qsync_opt.training.predictor.step_profile import steps_key

    s, prof = load_spec(spec), load_profile(path)
    if s.cluster.world_size > 1:
        return prof.allreduce[ddp_key(s)]["fp32_ms"]
    g = s.cluster.groups[0]
    sec = prof.find_section(g.env, group_threads(g, 1), local_ranks(s), runtime_tag(s.runtime))
    return sec.steps[steps_key(s, prepared.graph.for_batch(s.local_batches()[g.name]), g.name)]["fp32"]


def spread_pct(values) -> float:
    """(max − min) / mean, in percent."""
    return (max(values) - min(values)) / statistics.fmean(values) * 100


def window_noise_pct(rounds: list[dict[str, float]]) -> float:
    """Median over plans and pairs of rounds of |a − b| / mean(a, b), in percent (see the docstring)."""
    import itertools

    return statistics.median(abs(a[k] - b[k]) / ((a[k] + b[k]) / 2) * 100
                             for a, b in itertools.combinations(rounds, 2) for k in a)


def spearman(a, b) -> float:
    from scipy.stats import spearmanr

    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def indicator_rows(model: str, spec: dict, prepared, plans, batches: int) -> list[dict]:
    """Spearman of weight/GVAR/Hessian with empirical: per (op, precision), and per plan."""
    from qsync_opt.training.predictor.empirical import _mean_loss
    from qsync_opt.training.predictor.indicators import calibration_batches, compute_indicator
    from qsync_opt.runtime.apply import apply_plan

    cal = {"batches": batches, "batch_size": 16}
    sens = {}
    for m in ("weight", "gvar", "hessian", "empirical"):
        s = load_spec({**spec, "indicator": {"method": m, "calibration": cal}})
        sens[m], _ = compute_indicator(s, copy.deepcopy(prepared.module), prepared.graph, use_cache=False)
    s = load_spec({**spec, "indicator": {"method": "empirical", "calibration": cal}})
    data = calibration_batches(s)
    loss = lambda out, t: torch.nn.functional.cross_entropy(out.reshape(-1, out.size(-1)).float(), t.reshape(-1))  # noqa: E731
    base_model = copy.deepcopy(prepared.module).eval()
    base = _mean_loss(base_model, data, loss)
    changes = {}
    for key, plan in plans:
        m = apply_plan(copy.deepcopy(prepared.module).eval(), plan["native"])
        changes[key] = abs(_mean_loss(m, data, loss) - base)
    pairs = [(op, p) for op in sens["empirical"].omega for p in ("bf16", "int8")]
    emp = [sens["empirical"].omega[op][p] for op, p in pairs]
    rows = []
    for m in ("weight", "gvar", "hessian"):
        om = sens[m].omega
        rows.append({"model": model, "method": m, "level": "op", "spearman_vs_empirical":
                     spearman([om[op][p] for op, p in pairs], emp), "n": len(pairs)})
        sums = [sum(om[op][p] for op, p in plan["native"].items()) for _, plan in plans]
        rows.append({"model": model, "method": m, "level": "plan", "spearman_vs_empirical":
                     spearman(sums, [changes[k] for k, _ in plans]), "n": len(plans)})
    return rows


def verdict(mode: str, errors: list[float], noise: float) -> str:
    """The targets: single, median |error| <= max(3%, noise) and max <= 2x that; DDP, median <= max(5%, noise)."""
    limit = max(3.0 if mode == "single" else 5.0, noise)
    said = f"median {'met' if statistics.median(errors) <= limit else 'MISSED'}"
    if mode == "single":
        said += f", max {'met' if max(errors) <= 2 * limit else 'MISSED'}"
    return f"{said} (limit {limit:.1f}%)"


def write_csv(path: Path, rows: list[dict], header: str) -> None:
    buf = io.StringIO()
    buf.write("".join(f"# {line}\n" for line in header.splitlines()))
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def scatter(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    for (model, mode), mk in zip(sorted({(r["model"], r["mode"]) for r in rows}), "osD^v<>"):
        sel = [r for r in rows if (r["model"], r["mode"]) == (model, mode)]
        ax.scatter([r["measured_ms"] for r in sel], [r["predicted_ms"] for r in sel], marker=mk, label=f"{model} {mode}")
    lo = min(min(r["measured_ms"], r["predicted_ms"]) for r in rows) * 0.8
    hi = max(max(r["measured_ms"], r["predicted_ms"]) for r in rows) * 1.2
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xscale("log"), ax.set_yscale("log")
    ax.set_xlabel("measured iteration ms"), ax.set_ylabel("predicted iteration ms (replayer, profile)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="default: benchmarks/results/predictor_full")
    ap.add_argument("--quick", action="store_true", help="2 models, 8 plans each, 2 rounds")
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): tiny-cnn, 1 random plan, 2 rounds, batch 2, 1 block of 1 "
                         "call, the profiler at its fewest calls, 1 indicator level; needs --out")
    ap.add_argument("--models", help="comma-separated zoo models")
    ap.add_argument("--plans", type=int, help="random mixed plans per model (plus 3 uniform)")
    ap.add_argument("--rounds", type=int, help="profile/measure rounds")
    ap.add_argument("--batch", type=int, help="per-process batch (default 4 with --quick, else 8)")
    ap.add_argument("--blocks", type=int, default=4, help="estimator blocks (profile and measurement)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per block (profile and measurement)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.smoke and a.out is None:
        ap.error("--smoke needs --out DIR: a smoke run never writes benchmarks/results")
    a.out = a.out or str(Path(__file__).resolve().parent / "results" / "predictor_full")
    if a.smoke:
        a.models, a.plans, a.rounds, a.batch, a.blocks, a.repeats = "tiny-cnn", 1, 2, 2, 1, 1
    models = a.models.split(",") if a.models else (["tiny-cnn", "tiny-resnet"] if a.quick else
                                                    ["tiny-cnn", "tiny-resnet", "tiny-bert"])
    n_random = a.plans if a.plans is not None else (5 if a.quick else 20)
    rounds = a.rounds or (2 if a.quick else 3)
    if rounds < 2:
        ap.error(f"--rounds {rounds}: the noise floor compares rounds; give at least 2")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    a.batch = a.batch or (4 if a.quick else 8)
    os.environ["QSYNC_OPT_PROFILE_BLOCKS"] = str(a.blocks)  # the same estimator for both sides
    os.environ["QSYNC_OPT_PROFILE_REPEATS"] = str(a.repeats)
    if a.smoke:
        os.environ["QSYNC_OPT_PROFILE_BUDGET_MS"] = "1"
    command = "PYTHONPATH=. python benchmarks/predictor.py " + " ".join(sys.argv[1:] if argv is None else argv)
    t_start, load_start = time.time(), load()
    rng = random.Random(a.seed)
    rows, ind_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for model in models:
            base = specs(model, a.batch)
            prepared = {m: graph_of(s) for m, s in base.items()}
            plans = {m: make_plans(prepared[m], base[m], n_random, rng) for m in base}
            measured = {m: [] for m in base}
            round_profiles = []
            for r in range(rounds):
                path = tmp / f"{model}-round{r}.json"
                from qsync_opt.training.predictor.profiler import profile_spec

                for mode in base:  # a rank alone and two at once cost differently: a section each
                    profile_spec(load_spec(base[mode]), path, progress=False, log=lambda s: None)
                round_profiles.append(path)
                for mode in base:
                    measured[mode].append(measure(base[mode], plans[mode], tmp, warmup=STEP_WARMUP, blocks=a.blocks,
                                                   repeats=a.repeats))
                print(f"  {model}: round {r + 1}/{rounds} done, load {load()}", flush=True)
            merged = out / f"profile-{model}.json"
            merge_profiles(round_profiles, merged)
            for mode in base:
                spec = specs(model, a.batch, str(merged))[mode]
                pred = predict(spec, prepared[mode], plans[mode])
                med = {k: statistics.median(rd[k] for rd in measured[mode]) for k in measured[mode][0]}
                windows = (profiled_fp32_ms(spec, prepared[mode], merged), med["uniform-fp32"], med["uniform-fp32#2"])
                noise = window_noise_pct(measured[mode])
                for key, _ in plans[mode]:
                    rows.append({"model": model, "mode": mode, "plan": key, "predicted_ms": round(pred[key], 3),
                                 "measured_ms": round(med[key], 3), "noise_floor_pct": round(noise, 2),
                                 "error_pct": round((pred[key] - med[key]) / med[key] * 100, 2),
                                 "measured_rounds_ms": ";".join(f"{rd[key]:.3f}" for rd in measured[mode]),
                                 "fp32_windows_pct": round(spread_pct(windows), 2),
                                 "profiled_fp32_ms": round(windows[0], 3), "load": load()})
            ind_rows += indicator_rows(model, base["single"], prepared["single"], plans["single"],
                                 1 if a.smoke else 2 if a.quick else 4)
    header = (f"command: {command}\nmachine load (1/5/15 min) at start {load_start}, at end {load()}; "
              f"wall {time.time() - t_start:.0f} s; torch {torch.__version__}; 1 thread per process")
    write_csv(out / "predictor.csv", rows, header)
    write_csv(out / "indicators.csv", ind_rows, header)
    scatter(rows, out / "predictor_scatter.png")
    print(f"\npredicted vs measured iteration time (load now {load()})")
    print(f"{'model':12} {'mode':7} {'plans':>5} {'median err %':>12} {'max err %':>10} {'signed med %':>12} "
          f"{'noise floor %':>13} {'fp32 windows %':>14}  target")
    for model in models:
        for mode in ("single", "ddp"):
            mine = [r for r in rows if r["model"] == model and r["mode"] == mode]
            sel = [abs(r["error_pct"]) for r in mine]
            noise, fp32 = mine[0]["noise_floor_pct"], mine[0]["fp32_windows_pct"]
            print(f"{model:12} {mode:7} {len(sel):5} {statistics.median(sel):12.1f} {max(sel):10.1f} "
                  f"{statistics.median(r['error_pct'] for r in mine):12.1f} {noise:13.1f} {fp32:14.1f}  "
                  f"{verdict(mode, sel, noise)}")
    print("\nindicator rank correlation with the empirical loss change")
    for r in ind_rows:
        print(f"{r['model']:12} {r['method']:8} {r['level']:5} spearman {r['spearman_vs_empirical']:6.3f} (n={r['n']})")
    print(f"\nwrote {out}/predictor.csv, indicators.csv, predictor_scatter.png; wall {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
