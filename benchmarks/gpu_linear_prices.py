"""What the planner prices one large linear at on each GPU of the catalog, per precision and backward, and from what.

The linear of gpu_check's `ratios` step (8192 x 4096 -> 4096, forward + backward, fp32 in and out as the runtime
runs it) priced by training/predictor/costs.selectable_cost: bf16, fp8_e4m3 and fp8_e5m2 with a bf16 backward and
with `backward_precision: fp8`, int8. Each row says what priced it: `module` (a factor measured on that
architecture for the whole runtime module), `gemm` (the GEMMs at the rate their implementation measured alone
there), or `datasheet` (the catalog's efficiency). The next lent GPU's gpu_check prints the measured side of the
same rows; this table is the prediction it is held against. Deterministic: no timing here.

    PYTHONPATH=. python benchmarks/gpu_linear_prices.py --out DIR [--devices H100-SXM H200 L4] [--smoke]

Writes DIR/gpu_linear_prices.csv and prints the table. --smoke: one device.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_table import load_now, write_table  # noqa: E402
from qsync_opt.hardware.calibration import gemm_factor, op_kind  # noqa: E402
from qsync_opt.hardware.device import find_device  # noqa: E402
from qsync_opt.kernels.dispatch import Target, fp8_backward_impl  # noqa: E402
from qsync_opt.models.graph import OpNode  # noqa: E402
from qsync_opt.training.predictor.costs import forward_gemm_impl, fp8_grads, selectable_cost  # noqa: E402

M, K, N = 8192, 4096, 4096
NODE = OpNode("linear", "linear", True, ((M, K),), (M, N), 2 * M * K * N + M * N, 2 * (2 * M * K * N + M * N),
              K * N + N, 4 * M * K, 1, (N, K))
ROWS = (("bf16", "bf16"), ("fp8_e4m3", "bf16"), ("fp8_e4m3", "fp8"), ("fp8_e5m2", "bf16"), ("fp8_e5m2", "fp8"),
        ("int8", "bf16"))
DEVICES = ("H100-SXM", "H200", "L4")
COLS = ("device", "sm", "precision", "backward", "fwd_ms", "bwd_ms", "total_ms", "vs_bf16", "priced_by",
        "forward_gemm", "backward_gemm")


def priced_by(device, p: str, backward: str) -> str:
    """'module', 'gemm' or 'datasheet' (module docstring)."""
    fp8_bwd = fp8_grads(NODE.kind, p, backward)
    if device.calibration(p, op_kind(NODE.kind), "fp8" if fp8_bwd else None) is not None:
        return "module"
    fwd = forward_gemm_impl(NODE.kind, p, device, backward)
    bwd = fp8_backward_impl(Target.of_device_spec(device), p, device.kernels) if fp8_bwd else None
    return "gemm" if gemm_factor(device, p, fwd) or (bwd and gemm_factor(device, p, bwd)) else "datasheet"


def rows_for(name: str) -> list[dict]:
    d = find_device(name)
    out, base = [], None
    for p, backward in ROWS:
        if not d.supports(p):
            continue
        c = selectable_cost(NODE, p, d, backward, boundary="fp32")
        base = c.total_ms if p == "bf16" else base
        fp8_bwd = fp8_grads(NODE.kind, p, backward)
        out.append({"device": name, "sm": d.sm, "precision": p, "backward": backward if p != "bf16" else "-",
                    "fwd_ms": f"{c.fwd_ms:.3f}", "bwd_ms": f"{c.bwd_ms:.3f}", "total_ms": f"{c.total_ms:.3f}",
                    "vs_bf16": f"{base / c.total_ms:.2f}" if base else "-", "priced_by": priced_by(d, p, backward),
                    "forward_gemm": forward_gemm_impl(NODE.kind, p, d, backward).label,
                    "backward_gemm": fp8_backward_impl(Target.of_device_spec(d), p, d.kernels).label if fp8_bwd
                    else f"{backward} (torch.matmul)"})
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_linear_prices.csv")
    ap.add_argument("--devices", nargs="+", default=list(DEVICES))
    ap.add_argument("--smoke", action="store_true", help="one device")
    a = ap.parse_args(argv)
    devices = a.devices[:1] if a.smoke else a.devices
    load = load_now()
    rows = []
    for name in devices:
        try:
            rows += rows_for(name)
        except KeyError as e:
            raise SystemExit(f"error: --devices {name}: {e.args[0]}") from None
    path = write_table(Path(a.out) / "gpu_linear_prices.csv", "gpu_linear_prices.py", argv, COLS, rows, load)
    shown = COLS[:-2]
    print(f"linear {M}x{K} -> {N}, forward + backward, as the planner prices it (fp32 in and out)")
    print("  ".join(f"{c:>10}" for c in shown))
    for r in rows:
        print("  ".join(f"{str(r[c]):>10}" for c in shown))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
