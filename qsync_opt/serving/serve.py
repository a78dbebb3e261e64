"""`qsync-opt run SERVING_SPEC`: plan, serve the plan's pipeline for real, measure it, write the run folder.

OUT/plan.json (the plan), OUT/pipeline/ (what the stage processes read and wrote), OUT/serve.json
(every measured figure), OUT/requests.csv (per request: time to first token, time per output
token), OUT/timeline.png (each stage's compute over time) and OUT/report.md (the plan as `solve`
prints it, then predicted beside measured).

Requests of one batch arrive together when the batch starts (the planner's workload: a batch of
`global_batch` prompts of `prompt_len` tokens, `gen_tokens` generated greedily); several batches
(`serving.runtime.requests`) are served one after another. Time to first token is from the
batch's start to the end of the prefill micro-batch that produced the request's first token;
time per output token is (last token - first token) / (gen_tokens - 1).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from qsync_opt.errors import QSyncError, RuntimeSetupError, SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.runtime.process_exit import Stopped
from qsync_opt.runtime.spawn import free_port, spawn_ranks
from qsync_opt.serving.plan import ServingPlan
from qsync_opt.serving.spec import ServingJob
from qsync_opt.serving.weights import ModelSource, build, family_config, require_transformers, state_file

START_TIMEOUT_FLOOR_S = 10.0

PREDICTION_TOLERANCE = 0.15
"""Measured tokens/s within this fraction of the prediction confirm the plan's prediction; beyond it the run
says the plan's choice (made on predictions this far off) is not confirmed."""


def prediction_check(predicted: float, measured: float, tolerance: float = PREDICTION_TOLERANCE) -> dict:
    """Measured against predicted tokens/s as a fact: their ratio, whether it is within `tolerance`, and the
    sentence serve.json and report.md print (e.g. 'measured 0.70x the prediction (more than 15% below it): the
    plan's choice is not confirmed by this run')."""
    ratio = measured / predicted if predicted > 0 else float("inf")
    ok = abs(ratio - 1.0) <= tolerance + 1e-12  # the bound itself is within (0.85 - 1 is not exactly -0.15)
    tol = f"{100 * tolerance:.0f}%"
    if ok:
        text = f"measured {ratio:.2f}x the prediction (within {tol}): the prediction is confirmed by this run"
    else:
        side = "below" if ratio < 1 else "above"
        text = (f"measured {ratio:.2f}x the prediction (more than {tol} {side} it): the cost model is off by more "
                "than the margins between the plans it compares, so the plan's choice is not confirmed by this run")
    return {"measured_over_predicted": ratio, "tolerance": tolerance, "prediction_confirmed": ok, "verdict": text}


def model_source(job: ServingJob) -> ModelSource:
    """What every stage process builds; exit 2 here (naming the field) when transformers is missing or the
    checkpoint is none."""
    rt = job.serving.runtime
    require_transformers()
    if rt.checkpoint is not None:
        state_file(rt.checkpoint)  # a path that is no checkpoint is exit 2 here, before any process starts
    return ModelSource(family=rt.family, config=family_config(job.serving.model, rt.family),
                       checkpoint=rt.checkpoint, seed=rt.seed)


def prompts(job: ServingJob):
    """[requests, prompt_len] int64 token ids, as `serving.runtime.prompts` says."""
    import torch  # import cost: torch

    s, rt = job.serving, job.serving.runtime
    n, plen, vocab = rt.requests or s.global_batch, s.prompt_len, s.model.get("vocab")
    if rt.prompts == "random":
        return torch.randint(0, vocab, (n, plen), generator=torch.Generator().manual_seed(rt.seed))
    if vocab < 256:
        raise SpecError(f"serving.runtime.prompts: {rt.prompts!r} is byte-level text (token ids 0..255) but "
                        f"serving.model.vocab is {vocab}; give a vocabulary of at least 256 or prompts: random")
    if rt.prompts == "pysource":
        from qsync_opt.data.text import is_test_file, read_files, stdlib_files  # import cost: torch

        blob = read_files([f for f in stdlib_files() if is_test_file(f.name)], n * plen)
    else:
        p = Path(rt.prompts)
        if not p.is_file():
            raise SpecError(f"serving.runtime.prompts: {rt.prompts!r} is not 'pysource', 'random' or a text file; "
                            "give one of them")
        blob = p.read_bytes()[: n * plen]
    if len(blob) < n * plen:
        raise SpecError(f"serving.runtime.prompts: {rt.prompts!r} holds {len(blob)} bytes, fewer than requests x "
                        f"prompt_len = {n * plen}; lower serving.runtime.requests or give a longer text")
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(torch.int64).view(n, plen).clone()


def check_present(job: ServingJob) -> None:
    """RuntimeSetupError (exit 2) naming the first group whose device this machine cannot serve on."""
    cuda = None
    for i, g in enumerate(job.cluster.groups):
        if g.device_spec.kind == "cpu":
            continue
        if cuda is None:
            import torch  # import cost: torch

            cuda = torch.cuda.is_available()
        if not cuda:
            raise RuntimeSetupError(
                f"cluster.groups.{i}.device: {g.device_spec.name} is not present here (no CUDA device): `run` serves "
                "on this machine's CPU (devices cpu-local, cpu-sse41) or its CUDA GPUs; `qsync-opt solve SPEC` "
                "plans for any device")


def device_kind(job: ServingJob) -> str:
    kinds = {g.device_spec.kind for g in job.cluster.groups}
    return "cpu" if kinds == {"cpu"} else "cuda"


def stage_envs(job: ServingJob, plan: ServingPlan, port: int, ready: Path) -> list[dict[str, str]]:
    """Each stage's environment: the launcher's, OMP_NUM_THREADS (the CPU count over the stages unless the group's
    env sets it: a stage limited to fewer threads is a slower device), the group's env, the rendezvous."""
    groups = {g.name: g for g in job.cluster.groups}
    world = len(plan.stages)
    threads = max(1, (os.cpu_count() or 1) // world)
    envs = []
    for r, st in enumerate(plan.stages):
        g = groups[st.device.split("[")[0]]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), **g.env}
        if not env["OMP_NUM_THREADS"].isdigit() or int(env["OMP_NUM_THREADS"]) < 1:
            i = next(k for k, grp in enumerate(job.cluster.groups) if grp.name == g.name)
            raise SpecError(f"cluster.groups.{i}.env.OMP_NUM_THREADS: {env['OMP_NUM_THREADS']!r} is not a thread count; "
                            "give a positive integer, e.g. '1'")
        env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), QSYNC_GROUP=f"{st.device}, stage {r}",
                   QSYNC_READY_FILE=str(ready / f"stage{r}"))
        envs.append(env)
    return envs


def write_pipeline(job: ServingJob, plan: ServingPlan, workdir: Path) -> list[dict[str, str]]:
    """The stage processes' inputs in `workdir`, and their environments."""
    import torch  # import cost: torch

    if plan.spec_digest != job.digest():
        raise SpecError(f"plan: made from another spec (digest {plan.spec_digest}, this spec's is {job.digest()}); "
                        "solve this spec again")
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in list(workdir.glob("stage*.json")) + list(workdir.glob("tokens.pt")):
        stale.unlink()
    s = job.serving
    source = model_source(job)
    ready = workdir / "ready"
    ready.mkdir(exist_ok=True)
    for f in ready.iterdir():
        f.unlink()
    envs = stage_envs(job, plan, free_port(), ready)
    cfg = {"stages": [{"first": st.layers[0], "last": st.layers[1], "bits": st.bits, "device": st.device,
                       "threads": int(env["OMP_NUM_THREADS"])} for st, env in zip(plan.stages, envs, strict=True)],
           "source": source.__dict__, "dtype": s.runtime.dtype, "group_size": s.runtime.group_size,
           "global_batch": s.global_batch, "prompt_len": s.prompt_len, "gen_tokens": s.gen_tokens,
           "prefill_mb": plan.prefill_micro_batch, "decode_mb": plan.decode_micro_batch, "device": device_kind(job)}
    atomic_write_text(workdir / "pipeline.json", json.dumps(cfg, indent=2))
    torch.save(prompts(job), workdir / "prompts.pt")
    return envs


def run_pipeline(job: ServingJob, plan: ServingPlan, workdir: Path) -> dict:
    """Serve the plan with one process per stage; the stages' records and the tokens. A stage that fails ends
    the run (QSyncError, exit 1) naming it with its stderr's tail; a stop is `Stopped` (exit 4)."""
    import torch  # import cost: torch

    envs = write_pipeline(job, plan, workdir)
    argv = [sys.executable, "-m", "qsync_opt.serving.pipeline", str(workdir)]
    start = max(START_TIMEOUT_FLOOR_S, job.serving.runtime.start_timeout_s)
    done = spawn_ranks(argv, envs, start_timeout_s=start, grace_s=5.0, stdout=2)
    if done.signalled:
        raise Stopped(done.stop_signal or "SIGTERM", "while serving", "the pipeline's stages were stopped; "
                      "nothing measured was written")
    if done.failure is not None:
        raise QSyncError(f"serving pipeline: {done.failure}")
    stages = [json.loads((workdir / f"stage{r}.json").read_text()) for r in range(len(plan.stages))]
    tok = torch.load(workdir / "tokens.pt", weights_only=True)
    return {"stages": stages, "tokens": tok["tokens"], "token_times": tok["token_times"], "wall_s": done.wall_s}


def quality(job: ServingJob, plan: ServingPlan) -> list[dict]:
    """Perplexity of the served (quantised) model on the test text, for the plan, every baseline and uniform
    16-bit / lowest-bit, beside Σω (serving/quality_measured.py)."""
    from qsync_opt.serving.quality_measured import plan_perplexities  # import cost: torch and transformers

    return [{"policy": r.policy, "bits": "/".join(map(str, r.bits)), "sigma_omega": r.sigma_omega,
             "perplexity": r.perplexity} for r in plan_perplexities(job, plan, build(model_source(job)))]


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * (len(v) - 1))))]


def measure(job: ServingJob, plan: ServingPlan, served: dict) -> dict:
    """Throughput, latency percentiles, per-stage busy / bubble time and memory from the stages' records."""
    s = job.serving
    batch, gen = s.global_batch, s.gen_tokens
    n = served["tokens"].shape[0]
    rounds = n // batch
    first_events = [min(e[3] for e in st["events"] if e[5] == r) for r in range(rounds) for st in served["stages"][:1]]
    first_tok: dict[int, float] = {}
    last_tok: dict[int, float] = {}
    for r, step, a, b, t in served["token_times"]:
        for i in range(r * batch + a, r * batch + b):
            if step == 0:
                first_tok[i] = t
            if step == gen - 1:
                last_tok[i] = t
    ttft = [(first_tok[i] - first_events[i // batch]) * 1e3 for i in range(n)]
    tpot = [(last_tok[i] - first_tok[i]) * 1e3 / (gen - 1) for i in range(n)] if gen > 1 else []
    starts = [e[3] for st in served["stages"] for e in st["events"]]
    ends = [e[4] for st in served["stages"] for e in st["events"]]
    span = max(ends) - min(starts)
    per_stage = []
    for st, ps in zip(served["stages"], plan.stages):
        busy = sum(e[4] - e[3] for e in st["events"])
        # of the bubble: waiting for the call's input (the previous stage's activations, or stage 0's tokens back
        # from the last), the rest is the stage's own loop between calls (sends, bookkeeping)
        waited = sum(e[3] - e[6] for e in st["events"] if len(e) > 6)
        pre = [1e3 * (e[4] - e[3]) for e in st["events"] if e[0] == "prefill"]
        dec = [1e3 * (e[4] - e[3]) for e in st["events"] if e[0] == "decode"]
        per_stage.append({
            "stage": st["rank"], "device": ps.device, "layers": st["layers"], "bits": st["bits"],
            "busy_s": busy, "bubble_s": span - busy, "busy_frac": busy / span if span else 0.0,
            "input_wait_s": waited,
            "prefill_ms_p50": statistics.median(pre) if pre else None,
            "decode_ms_p50": statistics.median(dec) if dec else None,
            "predicted_prefill_ms": ps.prefill_ms, "predicted_decode_ms": ps.decode_ms,
            "weight_mb": st["weight_bytes"] / 2**20, "kv_cache_mb": st["kv_bytes"] / 2**20,
            "peak_mb": st["peak_bytes"] / 2**20, "peak_kind": st["peak_kind"], "threads": st["threads"],
        })
    tps = n * gen / span if span else 0.0
    return {
        "requests": n, "batches": rounds, "gen_tokens": gen, "span_s": span,
        "tokens_per_s": tps,
        "predicted_tokens_per_s": plan.prediction.tokens_per_s,
        **prediction_check(plan.prediction.tokens_per_s, tps),
        "ttft_ms_p50": statistics.median(ttft), "ttft_ms_p99": pct(ttft, 99),
        "tpot_ms_p50": statistics.median(tpot) if tpot else None, "tpot_ms_p99": pct(tpot, 99) if tpot else None,
        "predicted_e2e_ms": plan.prediction.e2e_ms, "measured_e2e_ms_per_batch": 1e3 * span / rounds,
        "stages": per_stage, "ttft_ms": ttft, "tpot_ms": tpot,
    }


def timeline(served: dict, plan: ServingPlan, path: Path, title: str) -> Path:
    import matplotlib  # import cost: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"prefill": "#4C72B0", "decode": "#DD8452"}
    S = len(served["stages"])
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.7 * S))
    for st in served["stages"]:
        r = st["rank"]
        for phase in ("prefill", "decode"):
            bars = [(e[3], e[4] - e[3]) for e in st["events"] if e[0] == phase]
            ax.broken_barh(bars, (r - 0.38, 0.76), facecolors=colors[phase], edgecolor="white", linewidth=0.3,
                           label=phase if r == 0 else None)
    ax.set_yticks(range(S))
    ax.set_yticklabels([f"stage {st.position}: {st.device}\nlayers {st.layers[0]}-{st.layers[1] - 1} "
                        f"@{'/'.join(str(b) for b in sorted(set(st.bits), reverse=True))} bit" for st in plan.stages],
                       fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the pipeline started (white gaps: the stage waits: bubbles)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # beside the bars, never over them
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def requests_csv(m: dict) -> str:
    lines = ["request,ttft_ms,tpot_ms"]
    for i, t in enumerate(m["ttft_ms"]):
        tp = m["tpot_ms"][i] if m["tpot_ms"] else ""
        lines.append(f"{i},{t:.3f},{tp if tp == '' else f'{tp:.3f}'}")
    return "\n".join(lines) + "\n"


def report_md(job: ServingJob, plan_text: str, m: dict) -> str:
    rows = ["| stage | device | layers | bits | busy | bubble (of it waiting for input) | prefill ms (pred / meas) | decode ms (pred / meas) "
            "| weights MB | KV MB | peak MB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for st in m["stages"]:
        bits = "/".join(str(b) for b in sorted(set(st["bits"]), reverse=True))
        rows.append(f"| {st['stage']} | {st['device']} | {st['layers'][0]}-{st['layers'][1] - 1} | {bits} "
                    f"| {st['busy_s']:.2f} s | {st['bubble_s']:.2f} s ({st.get('input_wait_s', 0.0):.2f} s) "
                    f"| {st['predicted_prefill_ms']:.2f} / {st['prefill_ms_p50']:.2f} "
                    f"| {st['predicted_decode_ms']:.3f} / {st['decode_ms_p50']:.3f} "
                    f"| {st['weight_mb']:.2f} | {st['kv_cache_mb']:.2f} | {st['peak_mb']:.0f} ({st['peak_kind']}) |")
    tp = "" if m["tpot_ms_p50"] is None else f"{m['tpot_ms_p50']:.2f} / {m['tpot_ms_p99']:.2f}"
    return (f"# {job.name}: served\n\n```\n{plan_text}\n```\n\n## Measured\n\n"
            f"| figure | predicted | measured |\n|---|---|---|\n"
            f"| tokens/s | {m['predicted_tokens_per_s']:.1f} | {m['tokens_per_s']:.1f} "
            f"({m['measured_over_predicted']:.2f}x) |\n"
            f"| one batch end to end | {m['predicted_e2e_ms']:.1f} ms | {m['measured_e2e_ms_per_batch']:.1f} ms |\n"
            f"| time to first token p50 / p99 | | {m['ttft_ms_p50']:.2f} / {m['ttft_ms_p99']:.2f} ms |\n"
            f"| time per output token p50 / p99 | | {tp} ms |\n\n"
            f"**{'Confirmed' if m['prediction_confirmed'] else 'Not confirmed'}: {m['verdict']}.**\n\n"
            f"{m['requests']} requests in {m['batches']} batch(es), {m['gen_tokens']} tokens each, greedy.\n\n"
            + "\n".join(rows) + "\n\n![timeline](timeline.png)\n" + quality_md(m.get("quality")))


def quality_md(records: list[dict] | None) -> str:
    if not records:
        return ""
    lines = ["", "## Quality, measured", "",
             "Perplexity of the served (quantised) model on the test text, beside the planner's Σω:", "",
             "| policy | bits per layer | Σω | perplexity |", "|---|---|---|---|"]
    lines += [f"| {r['policy']} | {r['bits']} | {r['sigma_omega']:.4g} | {r['perplexity']:.4f} |" for r in records]
    return "\n".join(lines) + "\n"
