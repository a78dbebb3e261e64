"""What each gpu_check step's numbers must satisfy for the step to pass (gpu_check.Run applies CHECKS by step
name), and the one-line verdict on #42's speed targets. Pure functions over the steps' results: tested on CPU
with given rows (tests/kernels/test_gpu_check_verdicts.py)."""

from __future__ import annotations

import math

from qsync_opt.precision import PRECISIONS

REL_ERR_TOLERANCE = {
    "fp32": 1e-5,       # fp32 accumulation over K ≤ 4096 (tf32 disabled): ~1e-6
    "tf32": 5e-3,       # 10-bit mantissa inputs: ~5e-4 on a GPU (fp32 itself on CPU)
    "bf16": 1e-2,       # 8-bit mantissa inputs: ~3e-3
    "fp16": 2e-3,       # 11-bit mantissa inputs: ~4e-4
    "fp8_e4m3": 8e-2,   # 4-bit mantissa, per-tensor scale: ~3.6e-2
    "fp8_e5m2": 1.5e-1,  # 3-bit mantissa: ~7.4e-2
    "int8": 3e-2,       # per-tensor activations, per-channel weights: ~1e-2
    "int4": 3e-1,       # 16 levels: ~0.16-0.19
}
"""Relative error of a runtime module's output against float64 (Gaussian inputs and weights), per precision:
about twice what the format's rounding gives (the comments: what CPU and GPU runs measure). Beyond it, the
format's path computes something else."""


def _bad_number(x) -> bool:
    """Missing, not a number, NaN or infinite."""
    return not isinstance(x, (int, float)) or not math.isfinite(x)


def ratio_problems(rows: list[dict]) -> list[str]:
    """Why the `ratios` step's numbers are wrong (empty: they are right)."""
    out = []
    for r in rows:
        name = f"{r.get('shape')} {r.get('precision')}" + (" (fp8 backward)" if r.get("backward") == "fp8" else "")
        if "error" in r:
            out.append(f"{name}: {r['error']}")
            continue
        err, tol = r.get("rel_err_vs_fp64"), REL_ERR_TOLERANCE.get(r.get("precision"))
        if _bad_number(err) or _bad_number(r.get("fwd_bwd_ms")):
            out.append(f"{name}: non-finite or missing figures (rel. error {err}, fwd+bwd {r.get('fwd_bwd_ms')})")
        elif tol is None:
            out.append(f"{name}: no tolerance stated for this precision")
        elif err > tol:
            out.append(f"{name}: relative error {err:.3g} vs float64 above its tolerance {tol:g}")
        gerr = r.get("grad_rel_err_vs_fp64")
        gtol = REL_ERR_TOLERANCE["fp8_e5m2"] if r.get("backward") == "fp8" else tol  # the e5m2 gradient's
        if gerr is not None and gtol is not None and not gerr <= gtol:
            out.append(f"{name}: input gradient relative error {gerr:.3g} vs float64 above its tolerance {gtol:g}")
    return out


#: #42's speed targets on the linear of `ratios`, fwd+bwd against bf16: fp8 and int8 must pay at least this much,
#: or the planner must never pick them on this device (it does not where a measured or calibrated fp8/int8 op is
#: slower than bf16: instance_builder.drop_dominated).
SPEED_TARGETS = {"fp8": 1.3, "int8": 1.15}


def speed_targets(rows: list[dict]) -> str:
    """One line: the best speed-up over bf16 of the fp8 rows (either backward) and of int8 on the linear of
    `ratios`, each against SPEED_TARGETS."""
    lin = [r for r in rows if r.get("shape", "").startswith("linear") and "speedup_vs_bf16" in r]
    out = []
    for fmt, target in SPEED_TARGETS.items():
        got = [r for r in lin if r["precision"].startswith(fmt)]
        if not got:
            out.append(f"{fmt}: not measured")
            continue
        best = max(got, key=lambda r: r["speedup_vs_bf16"])
        verdict = "met" if best["speedup_vs_bf16"] >= target else "not met (the planner must not pick it here)"
        out.append(f"{fmt}: best {best['speedup_vs_bf16']:.2f}x bf16 ({best['precision']}, backward "
                   f"{best.get('backward', '-')}; target {target}x): {verdict}")
    return "Speed targets on the linear: " + "; ".join(out) + "."


def library_problems(rows: list[dict]) -> list[str]:
    """Why the `libraries` step's numbers are wrong: every implementation must run (torchao's rows may say it is
    not installed: that is the machine's set-up, said in the row, not a failure of the code), be finite and lie
    within its precision's REL_ERR_TOLERANCE."""
    out = []
    for r in rows:
        name = f"{r.get('implementation')}{' (compiled)' if r.get('compiled') else ''}"
        if "error" in r:
            if "torchao is not installed" not in r["error"]:
                out.append(f"{name}: {r['error']}")
            continue
        err, tol = r.get("rel_err_vs_fp64"), REL_ERR_TOLERANCE.get(r.get("precision"))
        if _bad_number(err) or _bad_number(r.get("fwd_bwd_ms")):
            out.append(f"{name}: non-finite or missing figures (rel. error {err}, fwd+bwd {r.get('fwd_bwd_ms')})")
        elif err > tol:
            out.append(f"{name}: relative error {err:.3g} vs float64 above its tolerance {tol:g}")
    return out


def gemm_problems(rows: list[dict]) -> list[str]:
    """The integer GEMMs must be bit-exact (templated and Triton vs torch); fp8 within the accumulation bound
    of its implementation (kernels.reference.fp8_gemm_tolerance); the float baselines within their precision's
    REL_ERR_TOLERANCE. torch._scaled_mm's variants are facts to read, not checked: the runtime does not call them."""
    from qsync_opt.kernels.reference import fp8_gemm_tolerance

    out = []
    for r in rows:
        name = r.get("gemm")
        if "error" in r:
            out.append(f"{name}: {r['error']}")
        elif str(name).split()[0] in ("fp32", "tf32", "bf16"):  # float_gemms' baselines
            err, tol = r.get("torch_rel_err"), REL_ERR_TOLERANCE[str(name).split()[0]]
            if _bad_number(err) or err > tol or _bad_number(r.get("torch_ms")):
                out.append(f"{name}: relative error {err} above {tol:g}, or time {r.get('torch_ms')} not finite")
        elif str(name).startswith("int"):
            for key in ("bit_exact", "triton_bit_exact"):
                if (key == "bit_exact" and "note" not in r or key in r) and r.get(key) is not True:
                    out.append(f"{name}: {key} is {r.get(key)} (the integer GEMMs promise bit-exact results)")
        else:
            k = int(str(name).split()[-1].split("x")[1])  # "fp8_e4m3 MxKxN"
            for impl in ("auto", "templated"):
                err, tol = r.get(f"{impl}_rel_err"), fp8_gemm_tolerance(k, impl)
                if _bad_number(err) or err > tol:
                    out.append(f"{name}: {impl} relative error {err} above {tol:.3g} (its accumulation bound at K={k})")
    return out


def profile_problems(prof: dict) -> list[str]:
    """Every signature timed at every precision, with finite, non-negative times."""
    out = []
    for sig, s in prof.get("signatures", {}).items():
        for p, e in s.get("errors", {}).items():
            out.append(f"{sig} {p}: {e}")
        for kind in ("fwd_ms", "bwd_ms"):
            for p in PRECISIONS:
                v = s.get(kind, {}).get(p)
                if p not in s.get("errors", {}) and (_bad_number(v) or v < 0):
                    out.append(f"{sig} {p}: {kind} {v}")
    if not prof.get("ops"):
        out.append("no selectable op was profiled")
    return out


def train_problems(t: dict) -> list[str]:
    """Every loss finite, as many as steps were asked for."""
    losses = t.get("losses") or []
    out = [] if len(losses) == t.get("steps") else [f"{len(losses)} losses for {t.get('steps')} steps"]
    bad = [i for i, v in enumerate(losses) if _bad_number(v)]
    if bad:
        out.append(f"non-finite loss at step(s) {bad[:5]}: {[losses[i] for i in bad[:5]]}")
    return out


CHECKS = {"ratios": ratio_problems, "libraries": library_problems, "gemm_choices": gemm_problems,
          "profile": profile_problems, "train": train_problems}
"""Step name -> the function that says why its result is wrong."""
