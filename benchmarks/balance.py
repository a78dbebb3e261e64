"""Balancing variable-length samples over data-parallel ranks of equal and unequal speed.

Two gloo ranks (one thread each) train a small causal transformer (real
F.scaled_dot_product_attention) on a mix of two synthetic sources: short context (median
64 tokens) and long context (median 640, up to 1536), weights 3:1. Rank 0 holds the only
data plane (cursors, mix, balancer) and sends each step's ids and lengths to rank 1.
Every rank runs its samples one by one (no padding: a sample of L tokens costs c(L)),
sums its token losses, divides by the global target count, and all-reduces the gradients.

Settings: `equal` (both ranks as they are) and `unequal` (the last rank emulated at
1/--slow speed: after its local batch it sleeps (slow − 1) x its measured compute). Before
each setting both ranks time forward+backward at a few lengths; one fit per rank,
c_r(L) = c0 + a·L + b·L² in seconds (a device group's own curve), feeds `ours` and every
prediction; the speeds (ratio of fitted costs over the mix's lengths) order the ranks.
After every policy's step rank 0 refits each rank's curve with `loading.tracking.CostTracker`:
the shape on the calibration and every sample so far, a per-rank scale from the exponentially
weighted recent steps (half-life --half-life steps of one policy), so a rank whose speed drifts
during the run is followed. The single fit over everything (the earlier refit) is kept beside
it as `cpu_pred_err_plain`, the error it would have had.

Policies, side by side on the same global batches, interleaved per step in a rotating
order: stride (DistributedSampler), tokens-kk (Karmarkar-Karp on L), verl-kk (KK on the
FLOPs-based a·L + b·L², speeds ignored: verl's seqlen_balancing), ours (speed-aware
balancer on the measured c(L)). Columns: tokens_per_s (global tokens / wall step time),
step_ms (median wall step incl. all-reduce), idle_frac (faster rank's idle share of the
step), predicted_ms (median over steps of the slowest rank's Σ c(L)/speed, made before the
step ran), measured_ms (median slowest rank's compute), pred_err (median of measured /
predicted − 1), noise (median absolute deviation of that ratio: the in-run noise),
plan_ms (median planning time per step; tokens_per_s counts it as if on the critical path).
plan_wait_ms (ours only): rank 0's plane prefetches (`DataPlane(prefetch=True)`): its own `ours`
plan of step t+1 is made on a background thread while step t's four policies run, and this is the
median time `next_batch` then kept rank 0 waiting, the plan's share of the critical path once
overlapped (the background planning's CPU competes with rank 0's compute, which step_ms includes);
ours_overlapped_tokens_per_s counts that wait instead of plan_ms. The measured ours step runs the
split planned inline on the latest fit; the prefetched one is planned on the fit one step older.
The machine is shared (load in the CSV header), so wall times carry other users' work;
the cpu_* columns read each rank's process CPU time instead (x slow on the emulated rank):
cpu_ms is the slowest rank's CPU-seconds per step, cpu_tokens_per_s the global tokens over
their sum, cpu_pred_err / cpu_noise as above, r0_pred_err / r1_pred_err each rank's median
measured CPU / its own prediction − 1. The cost model and speeds are fitted on these CPU
times (per sample, calibration included). plane_ms: rank 0's data-plane work per step outside
the ranks' compute (refits after the previous step, planning of all four policies), which
rank 1 waits for; the predictions count compute only, tokens_per_s counts plan_ms.

Also: the planner alone for 256 samples over 8 ranks (heuristic and the default
configuration, with the exact program's gap after a long run), and the RSS of the source
state replicated on every rank against the central plane for a 1.5M-entry index.

    PYTHONPATH=. python benchmarks/balance.py --out DIR [--steps 12] [--batch 16] [--slow 2.0]
"""

from __future__ import annotations

import argparse
import csv
import gc
import io
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from qsync_opt.io import atomic_write_text
from qsync_opt.loading import balance as B
from qsync_opt.loading import collate
from qsync_opt.loading.cost import CostModel, fit, from_module
from qsync_opt.loading.plane import MIN_GAIN_S, DataPlane, SourceIndex
from qsync_opt.loading.sources import SyntheticLM
from qsync_opt.loading.tracking import CostTracker
from qsync_opt.runtime.process_exit import exit_without_destructors

from benchmarks.balance_memory import memory

POLICIES = ("stride", "tokens-kk", "verl-kk", "ours")
VOCAB, D, LAYERS, HEADS = 512, 128, 2, 4
SOURCES = (("short", dict(median=64, sigma=0.7, min_len=16, max_len=512), 3.0),
           ("long", dict(median=640, sigma=0.45, min_len=128, max_len=1536), 1.0))
CALIB = (32, 128, 384, 768, 1280)


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        B_, L, _ = x.shape
        q, k, v = (t.view(B_, L, HEADS, -1).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(D, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B_, L, D)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class SmallLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, D), nn.Embedding(2048, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        x = self.emb(ids) + self.pos(torch.arange(ids.size(1)))[None]
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def tokens_of(source: int, index: int, length: int) -> torch.Tensor:
    rng = np.random.default_rng([source, 0x52, index])
    return torch.from_numpy(rng.integers(0, VOCAB, length, dtype=np.int64))


def make_plane(speeds, cost, seed=0, prefetch=False) -> DataPlane:
    index = [SourceIndex(name, SyntheticLM(num_samples=20_000, vocab=VOCAB, seed=i, **kw).lengths, ((0, w),))
             for i, (name, kw, w) in enumerate(SOURCES)]
    return DataPlane(index, global_batch=ARGS.batch, speeds=speeds, cost=cost, seed=seed, prefetch=prefetch)


def run_local(model, samples, slow: float) -> tuple[float, list[tuple[int, float]]]:
    """Forward+backward of this rank's samples (globally normalised loss), one by one; a slow
    rank sleeps (slow − 1) x each sample's compute after it. (seconds, [(L, seconds)])."""
    t0 = time.perf_counter()
    per = []
    for ids, n_targets in samples:
        t1, c1 = time.perf_counter(), time.process_time()
        logits = model(ids[None])
        loss = collate.normalised_loss(collate.lm_loss_sum(logits, ids[None], torch.ones_like(ids[None], dtype=torch.bool)),
                                       n_targets)
        loss.backward()
        spent, cpu = time.perf_counter() - t1, time.process_time() - c1
        if slow > 1.0:
            time.sleep((slow - 1.0) * spent)
        per.append((int(ids.numel()), cpu * slow))
    return time.perf_counter() - t0, per


def calibrate(model, slow: float, reps: int = 5) -> list[float]:
    out = {L: [] for L in CALIB}
    for _ in range(reps):
        for L in CALIB:
            model.zero_grad(set_to_none=True)
            out[L].append(run_local(model, [(tokens_of(9, L, L), L - 1)], slow)[1][0][1])
    model.zero_grad(set_to_none=True)
    return [statistics.median(out[L]) for L in CALIB]


def allreduce_grads(model):
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    off = 0
    for p in model.parameters():
        n = p.numel()
        p.grad = flat[off:off + n].view_as(p).clone()
        off += n


def worker(rank: int, world: int, port: int, args, queue):
    global ARGS
    ARGS = args
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = SmallLM()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    flops_cost = from_module(model, layers=LAYERS, hidden=D, causal=True)
    records, meta = [], {}
    for setting, factor in (("equal", 1.0), ("unequal", args.slow)):
        slow = factor if rank == world - 1 else 1.0
        times = calibrate(model, slow, 1 if args.smoke else 5)
        all_times = [None] * world
        dist.all_gather_object(all_times, times)
        plan_info = None
        if rank == 0:
            # observations per rank: the calibration's, then every sample of every step
            calib = [[(L, t) for L, t in zip(CALIB, ts)] for ts in all_times]
            tracker = CostTracker(calib, half_life=args.half_life)
            obs = [list(c) for c in calib]  # the single fit over everything, for comparison only
            probe = make_plane([1.0] * world, CostModel.tokens())
            mix = [int(L) for src in probe.sources for L in src.lengths[:2000]]

            def refit():
                curves = tracker.curves()
                return curves, CostTracker.speeds_of(curves, mix)

            fits, speeds = refit()
            plain = [fit([L for L, _ in o], [t for _, t in o]) for o in obs]
            plane = make_plane(speeds, fits, prefetch=True)
            refit_s = 0.0  # rank 0's refit work since the last planning
            meta[setting] = {"calibration_fit": [f.as_dict() for f in fits], "calibration_speeds": speeds,
                             "fit_rel_err": max(abs(f(L) - t) / t for f, ts in zip(fits, all_times)
                                                for L, t in zip(CALIB, ts))}
        for step in range(args.warmup + args.steps):
            if rank == 0:
                base = plane.next_batch()
                plans = {}
                for p in POLICIES:
                    plans[p] = plane.assign(base.lengths, p, cost=flops_cost if p == "verl-kk" else None)
                plain_ranks = {p: [sum(plain[r](L) for L, o in zip(base.lengths, plans[p].owner) if o == r)
                                   for r in range(world)] for p in POLICIES}
                plan_info = {"samples": base.samples, "lengths": base.lengths,
                             "owners": {p: plans[p].owner for p in POLICIES},
                             "predicted": {p: max(plans[p].predicted) for p in POLICIES},
                             "pred_ranks": {p: plans[p].predicted for p in POLICIES},
                             "plain_ranks": plain_ranks,
                             "plan_s": {p: plans[p].plan_s for p in POLICIES},
                             "wait_s": base.wait_s,
                             "plane_s": refit_s + sum(plans[p].plan_s for p in POLICIES)}
                refit_s = 0.0
            box = [plan_info]
            dist.broadcast_object_list(box, src=0)
            info = box[0]
            n_targets = collate.target_count(info["lengths"])
            order = POLICIES[step % len(POLICIES):] + POLICIES[:step % len(POLICIES)]
            for p in order:
                mine = [(tokens_of(s, i, L), n_targets) for (s, i), L, o in
                        zip(info["samples"], info["lengths"], info["owners"][p]) if o == rank]
                opt.zero_grad(set_to_none=True)
                dist.barrier()
                t0 = time.perf_counter()
                compute, per = run_local(model, mine, slow)
                allreduce_grads(model)
                wall = time.perf_counter() - t0
                opt.step()
                seen = [None] * world
                dist.all_gather_object(seen, per)
                if rank == 0:
                    t_fit = time.perf_counter()
                    tracker.observe(seen)
                    refit_s += time.perf_counter() - t_fit
                    for r_, o in enumerate(seen):
                        obs[r_].extend(o)
                if step >= args.warmup:
                    records.append({"setting": setting, "policy": p, "step": step, "rank": rank, "compute_s": compute,
                                    "wall_s": wall, "tokens": sum(info["lengths"]),
                                    "predicted_s": info["predicted"][p] if rank == 0 else None,
                                    "predicted_rank_s": info["pred_ranks"][p][rank],
                                    "plain_rank_s": info["plain_ranks"][p][rank], "n_samples": len(mine),
                                    "plane_s": info["plane_s"] if rank == 0 else None,
                                    "cpu_s": sum(t for _, t in per),
                                    "plan_s": info["plan_s"][p] if rank == 0 else None,
                                    "wait_s": info["wait_s"] if rank == 0 else None})
            if rank == 0:
                t_fit = time.perf_counter()
                plane.cost, plane.speeds = refit()
                refit_s += time.perf_counter() - t_fit
                plain = [fit([L for L, _ in o], [t for _, t in o]) for o in obs]
        if rank == 0:
            plane.close()  # the prefetched step after the last is dropped
            meta[setting].update(fit=[f.as_dict() for f in plane.cost], speeds=plane.speeds)
    gathered = [None] * world
    dist.all_gather_object(gathered, records)
    if rank == 0:
        queue.put({"records": [r for g in gathered for r in g], "meta": meta})
    dist.destroy_process_group()
    # a plain exit can abort in C++ static destruction (gloo's threads: runtime/process_exit.py), as one
    # rank in a few smoke runs did ('terminate called without an active exception', SIGABRT)
    exit_without_destructors(0)


def summarise(records) -> list[dict]:
    rows = []
    by = {}
    for r in records:
        by.setdefault((r["setting"], r["policy"], r["step"]), []).append(r)
    for setting in ("equal", "unequal"):
        for p in POLICIES:
            steps = [v for (s, pp, _), v in sorted(by.items()) if s == setting and pp == p]
            if not steps:
                continue
            wall = [max(x["wall_s"] for x in st) for st in steps]
            slowest = [max(x["compute_s"] for x in st) for st in steps]
            fastest = [min(x["compute_s"] for x in st) for st in steps]
            idle = [(w - f) / w for w, f in zip(wall, fastest)]
            pred = [next(x["predicted_s"] for x in st if x["rank"] == 0) for st in steps]
            plan = [next(x["plan_s"] for x in st if x["rank"] == 0) for st in steps]
            wait = [next(x["wait_s"] for x in st if x["rank"] == 0) for st in steps]
            toks = sum(st[0]["tokens"] for st in steps)
            cpu = [max(x["cpu_s"] for x in st) for st in steps]
            plain = [max(x["plain_rank_s"] for x in st) for st in steps]
            rank_err = {r: statistics.median(x["cpu_s"] / x["predicted_rank_s"] for st in steps for x in st
                                             if x["rank"] == r and x["predicted_rank_s"] > 0) - 1
                        for r in (0, 1)}
            plane_s = [next(x["plane_s"] for x in st if x["rank"] == 0) for st in steps]
            cpu_ratio = [m / p_ for m, p_ in zip(cpu, pred)]
            c_med = statistics.median(cpu_ratio)
            med = statistics.median(slowest)
            ratio = [m / p_ for m, p_ in zip(slowest, pred)]
            r_med = statistics.median(ratio)
            noise = statistics.median(abs(x / r_med - 1) for x in ratio)
            rows.append({
                "setting": setting, "policy": p, "tokens_per_s": round(toks / (sum(wall) + sum(plan)), 1),
                "step_ms": round(1e3 * statistics.median(wall), 1), "idle_frac": round(statistics.median(idle), 3),
                "predicted_ms": round(1e3 * statistics.median(pred), 1), "measured_ms": round(1e3 * med, 1),
                "pred_err": round(r_med - 1, 3),
                "noise": round(noise, 3),
                "plan_ms": round(1e3 * statistics.median(plan), 2), "steps": len(steps),
                "cpu_tokens_per_s": round(toks / sum(cpu), 1), "cpu_ms": round(1e3 * statistics.median(cpu), 1),
                "cpu_pred_err": round(c_med - 1, 3),
                "cpu_noise": round(statistics.median(abs(x / c_med - 1) for x in cpu_ratio), 3),
                "r0_pred_err": round(rank_err[0], 3), "r1_pred_err": round(rank_err[1], 3),
                "cpu_pred_err_plain": round(statistics.median(m / p_ for m, p_ in zip(cpu, plain)) - 1, 3),
                "plane_ms": round(1e3 * statistics.median(plane_s), 2),
                "plan_wait_ms": round(1e3 * statistics.median(wait), 3) if p == "ours" else "",
                "ours_overlapped_tokens_per_s": round(toks / (sum(wall) + sum(wait)), 1) if p == "ours" else "",
            })
    for setting in ("equal", "unequal"):
        rs = [r for r in rows if r["setting"] == setting]
        for key, col in (("tokens_per_s", "vs_best_anchor"), ("cpu_tokens_per_s", "cpu_vs_best_anchor")):
            best_anchor = max((r[key] for r in rs if r["policy"] != "ours"), default=None)
            for r in rs:
                r[col] = round(r[key] / best_anchor, 3) if best_anchor else ""
    return rows


def planner_alone(fitted: dict, reps: int = 3) -> list[dict]:
    """256 samples over 8 ranks from the same mix, `reps` batches per speed profile: heuristic, default
    configuration, long exact run."""
    cost = CostModel(**fitted)
    rows = []
    index = [SyntheticLM(num_samples=20_000, vocab=VOCAB, seed=i, **kw).lengths for i, (_, kw, _) in enumerate(SOURCES)]
    rng = np.random.default_rng(7)
    for name, speeds in (("equal", [1.0] * 8), ("unequal", [1.0] * 4 + [0.5] * 4), ("graded", [1.0, .9, .8, .7, .6, .5, .4, .3])):
        for rep in range(reps):
            lengths = [int(index[0][rng.integers(len(index[0]))]) if rng.random() < 0.75 else
                       int(index[1][rng.integers(len(index[1]))]) for _ in range(256)]
            inst = B.make_instance(cost.costs(lengths), speeds, lengths)
            # a full collection first: this process holds torch, and a generation-2 collection
            # (~120 ms here) otherwise lands inside one of the timed calls, a pause of the
            # process, not of the planner
            gc.collect()
            heur = B.balance(inst, backend=None)
            gc.collect()
            dflt = B.balance(inst, backend="cpsat", time_limit_s=1.0, work_limit=0.02, gap_tol=1e-2,
                             min_gain=MIN_GAIN_S)  # the plane's defaults
            long = B.balance(inst, backend="highs", time_limit_s=ARGS.exact_s, accept_incumbent=True)
            bound = max(heur.bound, dflt.bound, long.bound)
            step_s = heur.makespan * inst.scale  # the predicted step of this batch on these ranks
            rows.append({
                "speeds": name, "rep": rep, "n": 256, "ranks": 8,
                "heuristic_ms": round(1e3 * heur.plan_s, 2), "default_ms": round(1e3 * dflt.plan_s, 2),
                "default_method": dflt.method, "predicted_step_ms": round(1e3 * step_s, 1),
                "default_share_of_step": round(dflt.plan_s / step_s, 4),
                "heuristic_gap": f"{(heur.makespan - bound) / heur.makespan:.2e}",
                "default_gap": f"{(dflt.makespan - bound) / dflt.makespan:.2e}",
                "exact_gap": f"{(long.makespan - bound) / long.makespan:.2e}",
                "exact_status": long.detail.get("exact_status", long.status), "exact_s": ARGS.exact_s,
            })
    return rows


def plot(records, path: Path) -> None:
    """Per-rank time per step (median over steps), predicted beside measured (CPU), per policy and setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, setting in zip(axes, ("equal", "unequal")):
        for j, p in enumerate(POLICIES):
            for r in range(2):
                xs = [x for x in records if x["setting"] == setting and x["policy"] == p and x["rank"] == r]
                if not xs:
                    continue
                meas = 1e3 * statistics.median(x["cpu_s"] for x in xs)
                pred = 1e3 * statistics.median(x["predicted_rank_s"] for x in xs)
                pos = j * 3 + r
                ax.bar(pos, meas, color=("tab:blue", "tab:orange")[r], label=f"rank {r} measured" if j == 0 else None)
                ax.plot([pos - 0.4, pos + 0.4], [pred, pred], color="black", lw=2,
                        label="predicted" if j == 0 and r == 0 else None)
        ax.set_xticks([j * 3 + 0.5 for j in range(len(POLICIES))], POLICIES)
        ax.set_title(f"{setting} ranks" + (f" (rank 1 at 1/{ARGS.slow} speed)" if setting == "unequal" else ""))
        ax.set_ylabel("CPU ms per step (median over steps)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle("Per-rank work per step: the step waits for the taller bar")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(rows, cols) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def write_csv(path: Path, rows, cols, header: str) -> None:
    buf = io.StringIO()
    buf.write(header)
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def main(argv=None) -> int:
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--slow", type=float, default=2.0)
    ap.add_argument("--exact-s", type=float, default=10.0)
    ap.add_argument("--half-life", type=float, default=4.0, help="CostTracker's half-life, in steps of one policy")
    ap.add_argument("--smoke", action="store_true",
                    help="smallest end-to-end run (tests): 2 steps of 8 samples, no warm-up, one calibration and "
                         "planner-alone repetition, exact runs of 0.2 s, memory read once per role")
    ARGS = ap.parse_args(argv)
    if ARGS.smoke:
        ARGS.steps, ARGS.warmup, ARGS.batch, ARGS.exact_s = 2, 0, 8, 0.2
    out = Path(ARGS.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "PYTHONPATH=. python benchmarks/balance.py " + " ".join(argv if argv is not None else sys.argv[1:])
    load_start, t_start = load(), time.time()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = 29500 + os.getpid() % 2000
    mp.start_processes(worker, args=(2, port, ARGS, queue), nprocs=2, join=True, start_method="spawn")
    res = queue.get()
    atomic_write_text(out / "balance_raw.json", __import__("json").dumps(res))
    rows = summarise(res["records"])
    meta = res["meta"]
    cols = ["setting", "policy", "tokens_per_s", "vs_best_anchor", "step_ms", "idle_frac", "predicted_ms",
            "measured_ms", "pred_err", "noise", "plan_ms", "cpu_tokens_per_s", "cpu_vs_best_anchor", "cpu_ms",
            "cpu_pred_err", "cpu_noise", "r0_pred_err", "r1_pred_err", "cpu_pred_err_plain", "plane_ms", "plan_wait_ms",
            "ours_overlapped_tokens_per_s", "steps"]
    print(table(rows, cols))
    for s, m in meta.items():
        curves = "; ".join(f"rank {r}: {f['c0']:.3g} + {f['a']:.3g}·L + {f['b']:.3g}·L²" for r, f in enumerate(m["fit"]))
        print(f"{s}: final fits c(L) [s] {curves}; speeds {[round(x, 3) for x in m['speeds']]} (calibration alone: "
              f"speeds {[round(x, 3) for x in m['calibration_speeds']]}, max rel. err {m['fit_rel_err']:.1%})")
    prow = planner_alone(meta["unequal"]["fit"][0], 1 if ARGS.smoke else 3)
    pcols = list(prow[0])
    print("\nplanner alone, 256 samples over 8 ranks:")
    print(table(prow, pcols))
    mrow = memory(reps=1 if ARGS.smoke else 3)
    mcols = list(mrow[0])
    print("\nsource state, replicated per rank vs central plane (RSS):")
    print(table(mrow, mcols))
    header = (f"# command: {command}\n# machine load (1/5/15 min) at start {load_start}, at end {load()}; "
              f"wall {time.time() - t_start:.0f} s; 2 gloo ranks, 1 thread each; unequal: last rank emulated at "
              f"1/{ARGS.slow} speed (sleeps (slow-1) x its compute)\n")
    fits = "; ".join(f"{s}: " + ", ".join(f"rank {r} c0={f['c0']:.4g} a={f['a']:.4g} b={f['b']:.4g}"
                                          for r, f in enumerate(m["fit"])) + f" speeds={[round(x, 3) for x in m['speeds']]}"
                     for s, m in meta.items())
    write_csv(out / "balance.csv", rows, cols, header + f"# fits (seconds): {fits}\n")
    write_csv(out / "balance_planner.csv", prow, pcols, header)
    write_csv(out / "balance_memory.csv", mrow, mcols, header)
    plot(res["records"], out / "balance.png")
    print(f"\nwrote {out}/balance.csv, balance_planner.csv, balance_memory.csv, balance.png; load {load()}")
    return 0


ARGS = None

if __name__ == "__main__":
    sys.exit(main())
