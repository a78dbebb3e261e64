"""The measurements of benchmarks/gpu_check.py, each a function over a device and a size.

Everything here also runs on CPU tensors (small sizes), which is how CI executes it without a GPU.
Times are medians of timed repeats after warm-up (CUDA events on a GPU, perf_counter on CPU).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from qsync_opt.kernels import ops, reference
from qsync_opt.kernels.dispatch import SCALED_MM_FAST, Target, fp8_backward_impl, fp8_training_forward_impl, gemm_impl
from qsync_opt.precision import PRECISIONS
from qsync_opt.runtime.qmodules import SWAPPABLE
from qsync_opt.runtime.recipe import Recipe


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn, device: torch.device, repeats: int, warmup: int = 2) -> float:
    """Median wall time of fn() in ms, synchronised around each call."""
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def backward_precision(device: torch.device) -> str:
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "fp16"
    return "bf16"


def quantized(module: nn.Module, precision: str, device: torch.device, kernels: str = "auto",
              backward: str | None = None) -> nn.Module:
    """A copy of `module` running at `precision` through the runtime's own quantized module, its int/fp8 backward
    at `backward` (default: the device's 16-bit format; 'fp8': fp8 linears' backward GEMMs in fp8)."""
    import copy

    m = copy.deepcopy(module)
    if precision != "fp32":
        m = SWAPPABLE[type(m)].from_float(m, Recipe(precision, backward or backward_precision(device), "per_channel",
                                                    "nearest", kernels))
    return m.to(device)


def reference64(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The fp32 module's output computed in float64: the yardstick for every precision."""
    w, b = module.weight.double(), None if module.bias is None else module.bias.double()
    if isinstance(module, nn.Linear):
        return F.linear(x.double(), w, b)
    return F.conv2d(x.double(), w, b, module.stride, module.padding, module.dilation, module.groups)


def measure_module(m: nn.Module, x: torch.Tensor, ref: torch.Tensor, device: torch.device, repeats: int,
                   row: dict) -> float:
    """Put `m`'s output error against the float64 `ref` (rel_err_vs_fp64) and its forward + backward time
    (fwd_bwd_ms, returned) on input `x` into `row`."""
    xg = x.clone().requires_grad_(True)

    def step():
        y = m(xg)
        y.backward(torch.ones_like(y))

    with torch.no_grad():
        y = m(x)
    row["rel_err_vs_fp64"] = float((y.detach().double() - ref).norm() / ref.norm())
    row["fwd_bwd_ms"] = time_ms(step, device, repeats)
    return row["fwd_bwd_ms"]


def reference_input_grad(base: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a Gaussian output gradient, the input gradient it gives through `base` in float64). Not all ones: 1.0 is
    exact in every format, and would hide the rounding of an fp8 gradient."""
    import copy

    x64 = x.detach().double().requires_grad_(True)
    ref = copy.deepcopy(base).double()(x64)
    gy = torch.randn(ref.shape, generator=torch.Generator().manual_seed(0)).to(x.device)
    ref.backward(gy.double())
    return gy, x64.grad


def input_grad_error(m: nn.Module, x: torch.Tensor, gy: torch.Tensor, ref_grad: torch.Tensor) -> float:
    """Relative error of `m`'s input gradient for output gradient `gy` against the float64 `ref_grad`."""
    xg = x.detach().clone().requires_grad_(True)
    y = m(xg)
    y.backward(gy.to(y.dtype))
    return float((xg.grad.double() - ref_grad).norm() / ref_grad.norm())


#: (precision, backward) rows `ratios` adds after every precision at the device's 16-bit backward: fp8 training
#: (runtime.backward_precision: fp8), the one way fp8 can beat bf16 by more than the forward GEMM's third.
FP8_BACKWARD_ROWS = (("fp8_e4m3", "fp8"), ("fp8_e5m2", "fp8"))


def shapes(big: bool) -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    """(label, fp32 module, input shape): large linear and conv shapes on a GPU, tiny ones on CPU."""
    torch.manual_seed(0)
    if big:
        return [("linear 8192x4096->4096", nn.Linear(4096, 4096), (8192, 4096)),
                ("conv3x3 b64 256->256 28x28", nn.Conv2d(256, 256, 3, padding=1), (64, 256, 28, 28))]
    return [("linear 64x96->80", nn.Linear(96, 80), (64, 96)),
            ("conv3x3 b2 8->16 8x8", nn.Conv2d(8, 16, 3, padding=1), (2, 8, 8, 8))]


def ratios(device: torch.device, big: bool, repeats: int) -> list[dict]:
    """fwd+bwd time of each precision's runtime module against fp32 and tf32, with its error
    against the float64 result and the implementation dispatch ran."""
    rows = []
    target = Target.of_tensor(torch.empty(0, device=device))
    for label, base, shape in shapes(big):
        x = torch.randn(shape, device=device)
        base = base.to(device)
        ref = reference64(base, x)
        gy, ref_grad = reference_input_grad(base, x)
        times, first = {}, len(rows)
        for p, bwd in [(p, None) for p in PRECISIONS] + list(FP8_BACKWARD_ROWS):
            impl = gemm_impl(target, p).label
            if bwd == "fp8" and isinstance(base, nn.Linear):
                impl += f"; backward {fp8_backward_impl(target, p).label}"
                if fp8_training_forward_impl(target, p).op == SCALED_MM_FAST:
                    impl += "; forward use_fast_accum"
            row = {"shape": label, "precision": p, "backward": bwd or ("-" if p in ("fp32", "tf32", "bf16", "fp16")
                                                                       else backward_precision(device)),
                   "implementation": impl}
            try:
                m = quantized(base, p, device, backward=bwd)
                times[(p, bwd)] = measure_module(m, x, ref, device, repeats, row)
                row["grad_rel_err_vs_fp64"] = input_grad_error(m, x, gy, ref_grad)
            except Exception as e:  # one format's failure must not hide the others' figures
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(row)
        for row in rows[first:]:
            if "fwd_bwd_ms" in row:
                for base_p in ("fp32", "tf32", "bf16"):
                    if (base_p, None) in times:
                        row[f"speedup_vs_{base_p}"] = times[(base_p, None)] / row["fwd_bwd_ms"]
    return rows


#: torchao float8 training recipes timed beside the runtime's own fp8 module (torchao.float8.Float8LinearConfig).
TORCHAO_RECIPES = ("tensorwise", "rowwise")


def torchao_float8():
    """torchao's float8 training API (convert_to_float8_training, Float8LinearConfig), or None when torchao is
    not installed (`pip install "qsync-opt[gpu]"`)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        return None
    return convert_to_float8_training, Float8LinearConfig


def library_linears(device: torch.device, big: bool, repeats: int, compile_: bool) -> list[dict]:
    """The linear of `ratios`, forward + backward, as each implementation a user could run instead of a plan:
    bf16 (autocast-style: module and input in bf16), the runtime's fp8_e4m3 module, and torchao's float8
    training (Float8Linear, each of TORCHAO_RECIPES), each eager and, with `compile_`, bf16 and torchao under
    torch.compile too (which fuses torchao's casts and scales; three compiles). Speed-ups are against bf16 eager and bf16 compiled; errors against
    float64. This is the table that says whether fp8 pays on this device and which implementation to dispatch."""
    import copy

    label, base, shape = shapes(big)[0]
    x = torch.randn(shape, device=device)
    ref = reference64(base.to(device), x)
    lib = torchao_float8()
    cands: list[tuple[str, str, object]] = [
        ("bf16", "torch bf16 module", lambda: copy.deepcopy(base).to(device, torch.bfloat16)),
        ("fp8_e4m3", "qsync runtime module", lambda: quantized(base, "fp8_e4m3", device)),
        ("fp8_e4m3", "qsync runtime module, fp8 backward", lambda: quantized(base, "fp8_e4m3", device, backward="fp8"))]
    for recipe in TORCHAO_RECIPES:
        def make(recipe=recipe):
            if lib is None:
                raise RuntimeError('torchao is not installed: pip install "qsync-opt[gpu]"')
            convert, config = lib
            holder = nn.Sequential(copy.deepcopy(base)).to(device, torch.bfloat16)
            convert(holder, config=config.from_recipe_name(recipe))
            return holder
        cands.append(("fp8_e4m3", f"torchao Float8Linear {recipe}", make))
    rows, times = [], {}
    for compiled in ((False, True) if compile_ else (False,)):
        for precision, impl, make in cands:
            if compiled and impl.startswith("qsync runtime module"):
                continue  # its autograd.Function ops are not what compile fuses; its eager row is the one dispatch runs
            row = {"shape": label, "precision": precision, "implementation": impl, "compiled": compiled}
            try:
                m = make()
                if compiled:
                    m = torch.compile(m)
                dtype = torch.bfloat16 if precision == "bf16" or impl.startswith("torchao") else torch.float32
                times[(impl, compiled)] = measure_module(m, x.to(dtype), ref, device, repeats, row)
            except Exception as e:  # one implementation's failure must not hide the others' figures
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(row)
    for row in rows:
        if "fwd_bwd_ms" in row:
            for c in (False, True):
                if ("torch bf16 module", c) in times:
                    row[f"speedup_vs_bf16{'_compiled' if c else ''}"] = times[("torch bf16 module", c)] / row["fwd_bwd_ms"]
    return rows


def float_gemms(x: torch.Tensor, w: torch.Tensor, repeats: int) -> list[dict]:
    """The baselines of `gemm_choices`: x @ w.T in fp32, tf32 (TF32 tensor cores for this call only) and bf16
    (operands and output in bf16), each with its error against float64 on the operands it multiplied."""
    device = x.device
    (m, k), n = x.shape, w.shape[0]
    rows = []
    for p, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                           ("bf16", torch.bfloat16, False)):
        row = {"gemm": f"{p} {m}x{k}x{n}"}
        a, b = x.to(dtype), w.to(dtype)
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            ref = a.double() @ b.double().t()
            row["torch_rel_err"] = float((F.linear(a, b).double() - ref).norm() / ref.norm())
            row["torch_ms"] = time_ms(lambda: F.linear(a, b), device, repeats)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
        rows.append(row)
    return rows


def scaled_mm_variants(xq, sx, wq, sw, ref: torch.Tensor, repeats: int, row: dict) -> None:
    """torch._scaled_mm on the e4m3 codes in two variants, into `row`: with fast accumulation as fp8 training's
    forward runs it (cuda_ops.scaled_mm with fast_accum; on Hopper it skips the periodic promotion of the tensor
    cores' accumulator to fp32), and with a bf16 output (half the bytes written; the runtime does not call it), each
    timed with its error against float64 and whether that stays within the library GEMM's accumulation bound
    (reference.fp8_gemm_tolerance; the bf16 output's rounding on top)."""
    from qsync_opt.kernels import cuda_ops
    from qsync_opt.kernels.reference import fp8_gemm_tolerance

    device, k = xq.device, xq.shape[1]
    s_a, s_b = sx.float().reshape(()), sw.float().reshape(())
    variants = (("fast_accum", lambda: cuda_ops.scaled_mm(xq, sx, wq, sw, None, fast_accum=True)),
                ("bf16_out", lambda: torch._scaled_mm(xq, wq.t(), scale_a=s_a, scale_b=s_b, out_dtype=torch.bfloat16)))
    for name, call in variants:
        try:
            err = float((call().double() - ref).norm() / ref.norm())
            row[f"{name}_rel_err"] = err
            row[f"{name}_within_bound"] = err <= fp8_gemm_tolerance(k, "auto") + (2.0 ** -8 if name == "bf16_out"
                                                                                   else 0.0)
            row[f"{name}_ms"] = time_ms(call, device, repeats)
        except Exception as e:  # what this torch or device refuses is a fact of it, recorded
            row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:200]


def gemm_choices(device: torch.device, big: bool, repeats: int) -> list[dict]:
    """One GEMM alone (the `ratios` linear's, 8192x4096x4096 on a GPU): the float baselines (`float_gemms`), then
    templated kernel vs torch op for the int8/int4/fp8 GEMMs (speed ratio and agreement: what dispatch's choices
    should follow on this architecture), and torch._scaled_mm's variants (`scaled_mm_variants`)."""
    m, k, n = (8192, 4096, 4096) if big else (64, 96, 80)
    g = torch.Generator(device="cpu").manual_seed(1)
    x, w = torch.randn(m, k, generator=g).to(device), torch.randn(n, k, generator=g).to(device)
    rows = float_gemms(x, w, repeats)
    for bits, fn in ((8, ops.int8_linear), (4, ops.int4_linear)):
        xq, sx = ops.quantize_symmetric(x, bits=bits)
        wq, sw = ops.quantize_symmetric(w, bits=bits, axis=0)
        row = {"gemm": f"int{bits} {m}x{k}x{n}"}
        try:
            y_t = fn(xq, sx, wq, sw, None, impl="torch")
            row["torch_ms"] = time_ms(lambda: fn(xq, sx, wq, sw, None, impl="torch"), device, repeats)
            if device.type == "cpu" and not reference.cpu_int_mm_exact():  # refused there: a fact, not a failure
                row["note"] = "templated refused: oneDNN's int8 GEMM is not exact on this CPU (no VNNI)"
                rows.append(row)
                continue
            y_k = fn(xq, sx, wq, sw, None, impl="templated")
            row["templated_ms"] = time_ms(lambda: fn(xq, sx, wq, sw, None, impl="templated"), device, repeats)
            row["bit_exact"] = bool(torch.equal(y_t, y_k))
            row["templated_speedup"] = row["torch_ms"] / row["templated_ms"]
            from qsync_opt.kernels import triton_gemm

            if bits == 8 and device.type == "cuda" and triton_gemm.available():  # the Triton family, for comparison
                y_tr = triton_gemm.int8_linear(xq, sx, wq, sw)
                row["triton_bit_exact"] = bool(torch.equal(y_tr, y_t))
                row["triton_ms"] = time_ms(lambda: triton_gemm.int8_linear(xq, sx, wq, sw), device, repeats)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
    for fmt in ("e4m3", "e5m2"):
        row = {"gemm": f"fp8_{fmt} {m}x{k}x{n}"}
        try:
            (xq, sx), (wq, sw) = ops.quantize_fp8(x, fmt), ops.quantize_fp8(w, fmt)
            ref = (xq.double() @ wq.double().t()) * (sx.double() * sw.double())
            for impl in ("auto", "templated"):
                y = ops.fp8_linear(xq, sx, wq, sw, None, impl=impl)
                row[f"{impl}_rel_err"] = float((y.double() - ref).norm() / ref.norm())
                row[f"{impl}_ms"] = time_ms(lambda: ops.fp8_linear(xq, sx, wq, sw, None, impl=impl), device, repeats)
            if fmt == "e4m3":
                scaled_mm_variants(xq, sx, wq, sw, ref, repeats, row)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
    return rows


def input_shapes(model: nn.Module, inputs: tuple) -> dict[str, tuple]:
    """FQN -> input shape of each selectable Linear/Conv2d of `model` in one forward on `inputs` (the model's
    output unchanged: the hooks return None, since a forward hook's return value replaces the module's output)."""
    from qsync_opt.runtime.apply import selectable_modules

    seen: dict[str, tuple] = {}

    def record(fqn):
        def hook(mod, inp, out):
            seen.setdefault(fqn, tuple(inp[0].shape))
        return hook

    hooks = [m.register_forward_hook(record(fqn))
             for fqn, m in selectable_modules(model).items() if isinstance(m, (nn.Linear, nn.Conv2d))]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return seen


def profile_model(name: str, batch: int, device: torch.device, repeats: int) -> dict:
    """Per selectable op of zoo model `name`: fwd and bwd ms at each precision, timed on the runtime's
    own module with the op's real input shape (captured by a forward hook). Ops with the same
    signature (module type, weight shape, input shape) are timed once."""
    from qsync_opt.models.zoo import get_entry

    entry = get_entry(name)
    model = entry.build()
    shapes_seen = input_shapes(model, entry.example_inputs(batch))
    mods = dict(model.named_modules())
    by_sig: dict[str, dict] = {}
    ops_out = {}
    for fqn, shape in shapes_seen.items():
        mod = mods[fqn]
        sig = f"{type(mod).__name__}{tuple(mod.weight.shape)}@{shape}"
        if sig not in by_sig:
            by_sig[sig] = {"fwd_ms": {}, "bwd_ms": {}}
            x = torch.randn(shape, device=device)
            for p in PRECISIONS:
                try:
                    m = quantized(mod, p, device)
                    xg = x.clone().requires_grad_(True)
                    fwd = time_ms(lambda: m(xg), device, repeats)
                    y = m(xg)
                    g = torch.ones_like(y)

                    def both():
                        m(xg).backward(g)

                    by_sig[sig]["fwd_ms"][p] = fwd
                    by_sig[sig]["bwd_ms"][p] = max(time_ms(both, device, repeats) - fwd, 0.0)
                except Exception as e:
                    by_sig[sig].setdefault("errors", {})[p] = f"{type(e).__name__}: {e}"[:200]
        ops_out[fqn] = {"signature": sig}
    return {"model": name, "batch": batch, "ops": ops_out, "signatures": by_sig}


def mixed_plan(model: nn.Module, device: torch.device) -> dict[str, str]:
    """FQN -> precision cycling through the formats this device runs without fp32 emulation."""
    from qsync_opt.runtime.apply import selectable_modules

    target = Target.of_tensor(torch.empty(0, device=device))
    cycle = [p for p in ("fp32", "bf16", "int8", "int4", "fp8_e4m3", "fp16")
             if gemm_impl(target, p).via != "fp32"]
    names = [n for n, m in selectable_modules(model).items() if not isinstance(m, nn.Embedding)]
    return {n: cycle[i % len(cycle)] for i, n in enumerate(names)}


def train_tiny(spec_path: str, steps: int, device: torch.device) -> dict:
    """Train the spec's model for `steps` on `device` (one process, the whole global batch) with a
    mixed plan; the losses, and whether they are finite and fell."""
    from qsync_opt.runtime.apply import apply_plan, current_precisions
    from qsync_opt.runtime.data import SyntheticTask, build_model
    from qsync_opt.training.runtime.trainer import make_optimizer
    from qsync_opt.training.spec import load_spec

    spec = load_spec(spec_path)
    torch.manual_seed(spec.training.seed)
    model = build_model(spec)
    plan = mixed_plan(model, device)
    model = apply_plan(model, plan, backward_precision=backward_precision(device)).to(device)
    task = SyntheticTask(spec)
    opt = make_optimizer(spec.training, model.parameters())
    losses, t0 = [], time.perf_counter()
    gb = spec.training.global_batch
    for step in range(steps):
        inputs, targets = task.batch(step, gb, 0, gb)
        opt.zero_grad(set_to_none=True)
        loss = task.loss(model(*(t.to(device) for t in inputs)), targets.to(device))
        loss.backward()
        opt.step()
        losses.append(float(loss))
    sync(device)
    counts: dict[str, int] = {}
    for p in current_precisions(model).values():
        counts[p] = counts.get(p, 0) + 1
    finite = all(torch.isfinite(torch.tensor(losses)).tolist())
    return {"spec": spec_path, "steps": steps, "precisions": counts, "losses": losses, "finite": finite,
            "fell": finite and min(losses[-3:]) < losses[0], "wall_s": time.perf_counter() - t0}

