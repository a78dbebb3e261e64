"""Kernel benchmark: GEMM forward and forward+backward per precision, and quantize bandwidth.

For GEMM shapes taken from the zoo models (ResNet-50 convolutions as GEMMs, BERT-base FFN linears,
and a 2048x2048 linear at batch 2048) it times, side by side and interleaved per repeat:
  fp32, bf16, fp16      x and W cast from fp32 masters each step (autocast-style), GEMMs in that dtype;
  int8 (templated/torch) forward: quantize x (per tensor) and W (per channel), int8 GEMM, dequantising
                         epilogue to fp32; backward in bf16 (grad_x = g @ W, grad_w = g^T @ x), fp32 result.
and reports medians and speedups over fp32. Quantize bandwidth is reported as a fraction of the
bandwidth of a memory copy of the same tensor (both counted as bytes read + bytes written).

    python benchmarks/kernel_speed.py [--quick] [--out results/] [--repeats N] [--threads 2]
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from qsync_opt.io import atomic_write_text
from qsync_opt.kernels import ops

# (label, M, K, N): M rows (batch x spatial or batch x tokens), K in-features, N out-features
SHAPES = [
    ("resnet50.layer1.conv3x3 b8", 8 * 56 * 56, 64 * 9, 64),
    ("resnet50.layer3.conv3x3 b8", 8 * 14 * 14, 256 * 9, 256),
    ("resnet50.layer4.conv1x1 b8", 8 * 7 * 7, 2048, 512),
    ("bert-base.ffn.up 128x8", 128 * 8, 768, 3072),
    ("bert-base.ffn.down 128x8", 128 * 8, 3072, 768),
    ("linear 2048x2048 b2048", 2048, 2048, 2048),
]
#: --quick: one real conv-as-GEMM and one small square linear, small enough that a CPU without native
#: bf16/fp16 GEMMs (AVX2 only: ~55x slower than fp32) still finishes in a few minutes
QUICK_SHAPES = [SHAPES[2], ("linear 512x512 b512", 512, 512, 512)]
#: --smoke: one tiny linear, so the whole path (every variant, the templated build, both CSVs) runs in seconds
SMOKE_SHAPES = [("linear 64x64 b64", 64, 64, 64)]
VARIANTS = ["fp32", "bf16", "fp16", "int8-templated", "int8-torch"]


def linear_step(kind: str, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor | None):
    """One forward (and, when g is given, backward) of y = x @ w.T in the named scheme."""
    if kind == "fp32":
        y = F.linear(x, w)
        if g is not None:
            return y, g @ w, g.T @ x
        return (y,)
    if kind in ("bf16", "fp16"):
        dt = torch.bfloat16 if kind == "bf16" else torch.float16
        xl, wl = x.to(dt), w.to(dt)
        y = F.linear(xl, wl)
        if g is not None:
            gl = g.to(dt)
            return y, gl @ wl, (gl.T @ xl).float()
        return (y,)
    impl = kind.split("-")[1]
    xq, sx = ops.quantize_symmetric(x, impl=impl)
    wq, sw = ops.quantize_symmetric(w, axis=0, impl=impl)
    y = ops.int8_linear(xq, sx, wq, sw, None, impl=impl)
    if g is not None:  # backward in bf16 on bf16 copies of x and W, weight gradient accumulated in fp32
        gl, xl, wl = g.to(torch.bfloat16), x.to(torch.bfloat16), w.to(torch.bfloat16)
        return y, gl @ wl, (gl.T @ xl).float()
    return (y,)


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_gemms(shapes, repeats: int) -> list[dict]:
    rows = []
    for label, m, k, n in shapes:
        gen = torch.Generator().manual_seed(0)
        x, w, g = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen) * k**-0.5, torch.randn(m, n, generator=gen)
        for v in VARIANTS:  # warm-up (and the one-time kernel build)
            linear_step(v, x, w, None)
        # CPUs without a native fp16 GEMM run fp16 through slow fallbacks (the transposed backward
        # GEMM takes minutes at 2048^3); time its backward only when its forward keeps up with fp32.
        fp16_slow = _time(lambda: linear_step("fp16", x, w, None)) > 2 * _time(lambda: linear_step("fp32", x, w, None))
        plan = [(v, mode) for v in VARIANTS for mode in ("fwd", "fwd+bwd") if not (v == "fp16" and mode == "fwd+bwd"
                                                                                  and fp16_slow)]
        times = {key: [] for key in plan}
        for _ in range(repeats):  # interleaved, so that machine noise hits every variant alike
            for v, mode in plan:
                times[(v, mode)].append(_time(lambda: linear_step(v, x, w, g if mode == "fwd+bwd" else None)))
        for mode in ("fwd", "fwd+bwd"):
            base = statistics.median(times[("fp32", mode)])
            for v in VARIANTS:
                row = {"shape": label, "M": m, "K": k, "N": n, "pass": mode, "variant": v}
                if (v, mode) not in times:
                    rows.append({**row, "median_ms": "", "min_ms": "", "speedup_vs_fp32": "", "gflops": "",
                                 "note": "skipped: fp16 forward > 2x fp32 (no fast fp16 GEMM on this CPU)"})
                    continue
                med = statistics.median(times[(v, mode)])
                rows.append({**row, "median_ms": round(med * 1e3, 3), "min_ms": round(min(times[(v, mode)]) * 1e3, 3),
                             "speedup_vs_fp32": round(base / med, 2),
                             "gflops": round((2 if mode == "fwd" else 6) * m * k * n / med / 1e9, 1), "note": ""})
    return rows


def bench_quantize(sizes, repeats: int) -> list[dict]:
    rows = []
    for rows_, cols in sizes:
        x = torch.randn(rows_, cols)
        dst = torch.empty_like(x)
        scale = x.abs().amax() / 127
        cases = {
            "copy": (lambda: dst.copy_(x), 2 * x.numel() * 4),
            "quantize templated (absmax+quantize)": (lambda: ops.quantize_symmetric(x, impl="templated"), x.numel() * 5),
            "quantize templated (given scale)": (lambda: ops.quantize_symmetric(x, scale=scale, impl="templated"),
                                                 x.numel() * 5),
            "quantize templated per-channel": (lambda: ops.quantize_symmetric(x, axis=0, impl="templated"), x.numel() * 5),
            "quantize torch (absmax+quantize)": (lambda: ops.quantize_symmetric(x, impl="torch"), x.numel() * 5),
        }
        times = {name: [] for name in cases}
        for fn, _ in cases.values():
            fn()
        for _ in range(repeats):
            for name, (fn, _) in cases.items():
                times[name].append(_time(fn))
        copy_bw = cases["copy"][1] / statistics.median(times["copy"])
        for name, (_, nbytes) in cases.items():
            med = statistics.median(times[name])
            best = min(times[name])
            rows.append({"op": name, "elements": x.numel(), "median_ms": round(med * 1e3, 3),
                         "min_ms": round(best * 1e3, 3), "GBps": round(nbytes / med / 1e9, 2),
                         "fraction_of_copy": round(nbytes / med / copy_bw, 2),
                         "fraction_of_copy_at_min": round((nbytes / best) / (cases["copy"][1] / min(times["copy"])), 2)})
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def print_table(title: str, rows: list[dict]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        print(f"\n{title}")
        print(" | ".join(rows[0]))
        for r in rows:
            print(" | ".join(str(v) for v in r.values()))
        return
    table = Table(title=title)
    for col in rows[0]:
        table.add_column(col, justify="right" if isinstance(rows[0][col], (int, float)) else "left")
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    Console(width=160).print(table)


def targets(gemm: list[dict], quant: list[dict]) -> list[str]:
    def speed(variant):
        return next((r["speedup_vs_fp32"] for r in gemm if r["shape"] == "linear 2048x2048 b2048"
                     and r["pass"] == "fwd+bwd" and r["variant"] == variant), None)

    out = []
    for variant in ("int8-templated", "bf16"):
        s = speed(variant)
        if s is not None:
            out.append(f"{variant} fwd+bwd 2048x2048 b2048: {s:.2f}x fp32 (target >= 2x): {'met' if s >= 2 else 'MISSED'}")
    fused = [r for r in quant if r["op"] == "quantize templated (absmax+quantize)"]
    if fused:  # the largest tensor: the one least likely to sit in the last-level cache
        r = max(fused, key=lambda r: r["elements"])
        out.append(f"quantize (absmax+quantize, templated, {r['elements']} elements): {r['fraction_of_copy']:.2f} of "
                   f"copy bandwidth (target >= 0.5): {'met' if r['fraction_of_copy'] >= 0.5 else 'MISSED'}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="two small shapes, fewer repeats: a few minutes even on an AVX2-only CPU, where bf16/fp16 GEMMs have no native path and run ~55x slower than fp32")
    p.add_argument("--smoke", action="store_true", help="smallest end-to-end run (tests): one 64x64 linear, one "
                   "64x64 quantize, 1 repeat; needs --out")
    p.add_argument("--out", default=None, help="directory for kernels_gemm.csv and kernels_quantize.csv (default: benchmarks/results/kernels)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per variant (default 7, quick 3)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    args = p.parse_args(argv)
    if args.smoke and args.out is None:
        p.error("--smoke needs --out DIR: a smoke run never writes benchmarks/results")
    args.out = args.out or str(Path(__file__).resolve().parent / "results" / "kernels")
    torch.set_num_threads(args.threads)
    repeats = 1 if args.smoke else args.repeats or (3 if args.quick else 7)
    if not ops.available("templated"):
        print("templated CPU kernels do not build here; see the KernelBuildError from ops.quantize_symmetric(..., "
              "impl='templated')", file=sys.stderr)
        return 1
    load_before = os.getloadavg()[0]
    gemm = bench_gemms(SMOKE_SHAPES if args.smoke else QUICK_SHAPES if args.quick else SHAPES, repeats)
    quant = bench_quantize([(64, 64)] if args.smoke else [(1024, 1024)] if args.quick else [(2048, 2048), (4096, 4096)],
                           2 * repeats + 1)
    out = Path(args.out)
    write_csv(out / "kernels_gemm.csv", gemm)
    write_csv(out / "kernels_quantize.csv", quant)
    print_table(f"GEMM time per precision (median of {repeats}, {args.threads} threads)", gemm)
    print_table("Quantize bandwidth vs memory copy", quant)
    for line in targets(gemm, quant):
        print(line)
    print(f"1-min load average: {load_before:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} CPUs "
          "(a load above the CPU count means other processes shared them: medians then include their time slices)")
    print(f"CSV written to {out}/kernels_gemm.csv and {out}/kernels_quantize.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
