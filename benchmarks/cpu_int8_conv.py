"""The runtime's convolution modules on this CPU, forward and forward+backward, side by side: fp32 (nn.Conv2d), the
bf16 module, and the int8 module (backward in bf16, QSync's recipe) through oneDNN's int8 convolution
(kernels.ops.int8_conv2d, where its probe proves it exact on this CPU) and through im2col + the templated int8 GEMM
(kernels='templated', the path before it).

ResNet-50's convolutions at batch 16: the 7x7 stem, a layer1 3x3, a layer3 3x3 and a layer4 1x1. Variants are
interleaved within each repeat (A B C D A B C D ...) and each figure is the median over repeats, so a load change
hits all alike; the machine's 1-minute load is printed before and after, with the CPU's model and ISA flags.

    PYTHONPATH=. python benchmarks/cpu_int8_conv.py --out DIR [--repeats 7] [--threads 2] [--smoke]

Writes DIR/cpu_int8_conv.csv and prints the table. --smoke: one small convolution, one repeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.results_table import load_now, write_table  # noqa: E402
from qsync_opt.hardware.machine import cpu_description  # noqa: E402
from qsync_opt.kernels import ops as kops  # noqa: E402
from qsync_opt.runtime.qmodules import SWAPPABLE  # noqa: E402
from qsync_opt.runtime.recipe import Recipe  # noqa: E402

#: (label, batch, in, out, kernel, stride, padding, spatial)
SHAPES = [
    ("resnet50.conv1 7x7 s2 b16", 16, 3, 64, 7, 2, 3, 224),
    ("resnet50.layer1 3x3 b16", 16, 64, 64, 3, 1, 1, 56),
    ("resnet50.layer3 3x3 b16", 16, 256, 256, 3, 1, 1, 14),
    ("resnet50.layer4 1x1 b16", 16, 2048, 512, 1, 1, 0, 7),
]
SMOKE = [("conv 3x3 16ch b2", 2, 16, 16, 3, 1, 1, 8)]
VARIANTS = ("fp32", "bf16", "int8 oneDNN", "int8 im2col")
COLS = ("shape", "variant", "fwd_ms", "fwd_bwd_ms", "fwd_bwd_speedup_vs_fp32", "path", "threads", "cpu")


def modules(conv: nn.Conv2d) -> dict[str, tuple[nn.Module, str]]:
    """variant -> (module, what its forward runs)."""
    out = {"fp32": (conv, "nn.Conv2d fp32"),
           "bf16": (SWAPPABLE[type(conv)].from_float(conv, Recipe("bf16", "bf16")), "bf16 module")}
    int8 = SWAPPABLE[type(conv)].from_float(conv, Recipe("int8", "bf16", granularity="per_channel"))
    out["int8 oneDNN"] = (int8, "oneDNN int8 conv" if kops.onednn_conv_exact() else
                          "im2col + int8 GEMM (oneDNN not exact here)")
    if kops.available("templated"):
        out["int8 im2col"] = (SWAPPABLE[type(conv)].from_float(
            conv, Recipe("int8", "bf16", granularity="per_channel", kernels="templated")), "im2col + templated GEMM")
    return out


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def bench(shape, repeats: int) -> list[dict]:
    label, b, ci, co, k, s, p, hw = shape
    torch.manual_seed(0)
    conv = nn.Conv2d(ci, co, k, stride=s, padding=p, bias=False)
    x = torch.randn(b, ci, hw, hw, requires_grad=True)
    mods = modules(conv)

    def fwd(m):
        with torch.no_grad():
            m(x)

    def fwd_bwd(m):
        m(x).sum().backward()

    for m, _ in mods.values():  # warm-up: kernels chosen, memory touched
        fwd(m)
        fwd_bwd(m)
    times: dict[str, tuple[list[float], list[float]]] = {v: ([], []) for v in mods}
    for _ in range(repeats):
        for v, (m, _) in mods.items():
            times[v][0].append(timed(lambda: fwd(m)))
            times[v][1].append(timed(lambda: fwd_bwd(m)))
    base = statistics.median(times["fp32"][1])
    rows = []
    for v, (_, path) in mods.items():
        f, fb = statistics.median(times[v][0]), statistics.median(times[v][1])
        rows.append({"shape": label, "variant": v, "fwd_ms": f"{f:.2f}", "fwd_bwd_ms": f"{fb:.2f}",
                     "fwd_bwd_speedup_vs_fp32": f"{base / fb:.2f}", "path": path})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for cpu_int8_conv.csv")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--smoke", action="store_true", help="one small convolution, one repeat")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        ap.error(f"--repeats {args.repeats} / --threads {args.threads}: both must be at least 1")
    torch.set_num_threads(args.threads)
    before = load_now()
    cpu = cpu_description()
    where = f"{cpu['cpu']} ({', '.join(cpu['isa'])}), {os.cpu_count()} cores"
    rows = [{**r, "threads": args.threads, "cpu": where}
            for shape in (SMOKE if args.smoke else SHAPES) for r in bench(shape, 1 if args.smoke else args.repeats)]
    path = write_table(Path(args.out) / "cpu_int8_conv.csv", "cpu_int8_conv.py", sys.argv[1:] if argv is None else argv,
                       COLS, rows, before)
    print(f"{where}; torch {torch.__version__}; oneDNN int8 convolution exact here: {kops.onednn_conv_exact()}; "
          f"load {before:.2f} -> {load_now():.2f}")
    print(f"{'shape':28} {'variant':12} {'fwd ms':>8} {'fwd+bwd ms':>11} {'x fp32':>7}  path")
    for r in rows:
        print(f"{r['shape']:28} {r['variant']:12} {r['fwd_ms']:>8} {r['fwd_bwd_ms']:>11} "
              f"{r['fwd_bwd_speedup_vs_fp32']:>7}  {r['path']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
