"""Serving for real on this machine: the LLM-PQ plan and every baseline served by a CPU pipeline, measured and
predicted, with the perplexity of each one's quantised model.

    PYTHONPATH=$PWD python benchmarks/serving_real.py --out DIR [--stages 2|3] [--repeats 3] [--smoke]

The model is a transformers Llama trained here as a byte-level language model on the Python standard library's
text (benchmarks/serving_model.py: the product's own training kind on examples/cpu_hf_llama_pysource.yaml with
4 layers; cached in DIR/model). The pipeline's stages are CPU groups of this machine made unequal: stage 0 runs
oneDNN's native kernels, stage 1 is capped at SSE4.1 (ONEDNN_MAX_CPU_ISA, catalog device cpu-sse41), stage 2
(with --stages 3) is a second native one; one thread each. For every policy (the plan, uniform, pipeedge, adabits)
the same spec's pipeline serves `requests` prompts (policies alternating, `--repeats` times each; medians) of the pysource test text; perplexity is the quantised model's
on that text (windows of prompt_len + gen_tokens bytes). Writes DIR/serving_real.csv (policy,
predicted_tokens_per_s, measured_tokens_per_s, ttft_ms_p50, tpot_ms_p50, perplexity, sigma_omega, ...) with the
command and machine load in a header comment. --smoke: random weights, one short batch, the plan and uniform.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_table import load_now, write_table  # noqa: E402
from serving_model import serving_spec as serving_model_spec  # noqa: E402
from serving_model import trained_llama  # noqa: E402

from qsync_opt.serving import serve  # noqa: E402
from qsync_opt.serving.planner import plan_serving  # noqa: E402
from qsync_opt.serving.quality_measured import plan_perplexities  # noqa: E402
from qsync_opt.serving.spec import load_serving_spec  # noqa: E402
from qsync_opt.serving.weights import build  # noqa: E402
from qsync_opt.solver.budget import Budget  # noqa: E402

FIELDS = ["policy", "predicted_tokens_per_s", "measured_tokens_per_s", "measured_over_predicted", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50",
          "tpot_ms_p99", "perplexity", "sigma_omega", "partition", "micro_batches", "busy_frac", "load1"]


def serving_spec(stages: int, checkpoint: str | None, smoke: bool) -> dict:
    """serving_model's spec for the trained model, on this machine's unequal CPU groups, costs measured."""
    groups = [{"name": "native", "device": "cpu-local", "count": 1, "env": {"OMP_NUM_THREADS": "1"}},
              {"name": "sse41", "device": "cpu-sse41", "count": 1,
               "env": {"ONEDNN_MAX_CPU_ISA": "SSE41", "OMP_NUM_THREADS": "1"}}]
    if stages == 3:
        groups.append({"name": "native2", "device": "cpu-local", "count": 1, "env": {"OMP_NUM_THREADS": "1"}})
    spec = serving_model_spec(None if checkpoint is None else Path(checkpoint), bits=(3, 4, 8, 16),
                              windows=2 if smoke else 64, prompt_len=56 if smoke else 48,
                              global_batch=4 if smoke else 8)
    spec["name"] = f"byte-llama-{stages}-stage"
    spec["cluster"]["groups"] = groups
    spec["serving"].update(costs="measured", quality={"max_indicator": None})
    spec["serving"]["runtime"]["requests"] = 4 if smoke else 32
    return spec


def bound_between(job, frac: float) -> float:
    """A Σω bound `frac` of the way from all-16-bit (0) to all layers at the lowest bit-width."""
    from qsync_opt.serving.quality import layer_omegas

    s = job.serving
    om, _ = layer_omegas(s.model, s.bits, s.quality.stats)
    return frac * sum(o[min(s.bits)] for o in om)


def policies(job, plan):
    """(name, plan-shaped object) for the plan and every baseline that fits."""
    out = [("plan", plan)]
    for b in plan.baselines:
        if b.fits and b.prediction is not None:
            out.append((b.name, plan.model_copy(update={
                "stages": b.stages, "prefill_micro_batch": b.prefill_micro_batch,
                "decode_micro_batch": b.decode_micro_batch, "prediction": b.prediction})))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--stages", type=int, choices=(2, 3), default=2)
    ap.add_argument("--bound", type=float, default=0.5,
                    help="the plan's Σω bound as a fraction of the all-lowest-bit Σω (0: every layer 16-bit)")
    ap.add_argument("--policies", default=None,
                    help="comma-separated subset of plan,uniform,pipeedge,adabits (default: all; --smoke: plan,uniform)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="times each policy is served, policies alternating (A B C A B C ...); figures are medians")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.smoke:  # a smoke run's rough measurements never land in the user's profile cache
        os.environ["QSYNC_OPT_PROFILE_DIR"] = str(out / "profiles")
        os.environ.setdefault("QSYNC_OPT_SERVING_PROFILE_CAP", "7")
        os.environ.setdefault("QSYNC_OPT_LINK_ROUNDS", "5")
    load0 = load_now()
    checkpoint = None if args.smoke else str(trained_llama(out / "model"))
    spec = serving_spec(args.stages, checkpoint, args.smoke)
    job = load_serving_spec(spec)
    spec["serving"]["quality"]["max_indicator"] = bound_between(job, args.bound)
    job = load_serving_spec(spec)
    (out / "serving_real.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    plan = plan_serving(job, Budget(job.solver.time_limit_s))
    model = build(serve.model_source(job))
    rows = []
    wanted = (args.policies or ("plan,uniform" if args.smoke else "plan,uniform,pipeedge,adabits")).split(",")
    chosen = [(n, p) for n, p in policies(job, plan) if n in wanted]
    runs: dict[str, list[dict]] = {n: [] for n, _ in chosen}
    for rep in range(1 if args.smoke else args.repeats):
        for name, p in chosen:  # alternating, so a load change hits every policy alike
            t0 = time.perf_counter()
            runs[name].append(serve.measure(job, p, serve.run_pipeline(job, p, out / f"pipeline-{name}")))
            print(f"  {name} #{rep + 1}: {runs[name][-1]['tokens_per_s']:.1f} tokens/s, served in "
                  f"{time.perf_counter() - t0:.1f} s (load {load_now():.2f})", file=sys.stderr)
    quality = {r.policy: r for r in plan_perplexities(job, plan, model)}
    for name, p in chosen:
        ms = runs[name]
        med = lambda key: statistics.median(m[key] for m in ms)  # noqa: E731
        ppl = quality[name].perplexity
        rows.append({
            "policy": name, "predicted_tokens_per_s": round(p.prediction.tokens_per_s, 1),
            "measured_tokens_per_s": round(med("tokens_per_s"), 1),
            "measured_over_predicted": round(med("tokens_per_s") / p.prediction.tokens_per_s, 3),
            "ttft_ms_p50": round(med("ttft_ms_p50"), 2), "ttft_ms_p99": round(med("ttft_ms_p99"), 2),
            "tpot_ms_p50": None if ms[0]["tpot_ms_p50"] is None else round(med("tpot_ms_p50"), 3),
            "tpot_ms_p99": None if ms[0]["tpot_ms_p99"] is None else round(med("tpot_ms_p99"), 3),
            "perplexity": round(ppl, 4), "sigma_omega": round(p.prediction.quality, 6),
            "partition": " | ".join(f"{st.layers[0]}-{st.layers[1] - 1}@{'/'.join(map(str, st.bits))}"
                                    for st in p.stages),
            "micro_batches": f"{p.prefill_micro_batch}/{p.decode_micro_batch}",
            "busy_frac": " ".join(f"{statistics.median(m['stages'][i]['busy_frac'] for m in ms):.2f}"
                                  for i in range(len(p.stages))),
            "load1": round(load_now(), 2)})
    argv = sys.argv[1:] if argv is None else argv
    write_table(out / "serving_real.csv", "serving_real.py", argv, FIELDS, rows, load0)
    print(f"{'policy':10} {'pred tok/s':>10} {'meas tok/s':>10} {'TTFT p50':>9} {'TPOT p50':>9} {'ppl':>8} {'Σω':>10}  "
          f"partition (micro-batches)")
    for r in rows:
        print(f"{r['policy']:10} {r['predicted_tokens_per_s']:>10} {r['measured_tokens_per_s']:>10} {r['ttft_ms_p50']:>9} "
              f"{r['tpot_ms_p50']!s:>9} {r['perplexity']:>8} {r['sigma_omega']:>10}  {r['partition']} ({r['micro_batches']})")
    print(f"costs: {plan.cost_source}; Σω bound {job.serving.quality.max_indicator:.4g}; load (1 min) {load0:.2f} -> "
          f"{load_now():.2f} on {os.cpu_count()} CPUs ({platform.processor() or platform.machine()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
