"""Why uniform int4 costs the harness little: the same int4 training, two ways of evaluating it.

One process, the harness's CNN (benchmarks/accuracy_models.py: resnet1d, width 16) on MNIST-1D,
every selectable op at one format through the runtime's own modules (qsync_opt.runtime.apply_plan),
Adam 3e-3, batch 64. After training, test accuracy is read twice:
  fp32-eval   the trained fp32 master weights run in fp32 (what the harness and the trainer report:
              the network training produced, QSync's setting)
  quant-eval  the same weights run through the quantized modules (the int4 network as inference)

    python benchmarks/accuracy_int4.py --out DIR [--steps 800] [--seeds 2]
        [--configs fp32,int4,int4/per_channel,int8,int4/bwd=fp32]

Writes DIR/accuracy_int4.csv (command and machine load in the header) and prints mean ± std.
"""

from __future__ import annotations

import argparse
import copy
import csv
import io
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from accuracy_models import resnet1d  # noqa: E402

from qsync_opt.data.builtin import mnist1d  # noqa: E402
from qsync_opt.io import atomic_write_text  # noqa: E402
from qsync_opt.runtime.apply import apply_plan, selectable_modules, strip  # noqa: E402


def parse(config: str) -> dict:
    """'int4/per_channel/bwd=fp32' -> {precision, granularity, backward}."""
    parts = config.split("/")
    out = {"precision": parts[0], "granularity": "per_tensor", "backward": "bf16"}
    for p in parts[1:]:
        if p in ("per_tensor", "per_channel"):
            out["granularity"] = p
        elif p.startswith("bwd="):
            out["backward"] = p[4:]
        else:
            raise SystemExit(f"--configs: {p!r} in {config!r} is neither per_tensor/per_channel nor bwd=<dtype>")
    return out


def train(cfg: dict, seed: int, steps: int, batch: int = 64, lr: float = 3e-3) -> dict:
    x, y, xt, yt = mnist1d()
    x, xt = x.unsqueeze(1), xt.unsqueeze(1)
    torch.manual_seed(seed)
    model = resnet1d(width=16)
    if cfg["precision"] != "fp32":
        model = apply_plan(model, dict.fromkeys(selectable_modules(model), cfg["precision"]),
                           weight_granularity=cfg["granularity"], backward_precision=cfg["backward"])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    perm, i, t0 = torch.randperm(len(x), generator=g), 0, time.time()
    for _ in range(steps):
        if i + batch > len(x):
            perm, i = torch.randperm(len(x), generator=g), 0
        idx = perm[i:i + batch]
        i += batch
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    train_s = time.time() - t0
    model.eval()
    with torch.no_grad():
        quant = (model(xt).argmax(-1) == yt).float().mean().item()
        plain = (strip(copy.deepcopy(model))(xt).argmax(-1) == yt).float().mean().item()
    return {"fp32_eval": plain, "quant_eval": quant, "train_s": round(train_s, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--configs", default="fp32,int4,int4/per_channel,int8,int4/bwd=fp32")
    ap.add_argument("--smoke", action="store_true", help="smallest end-to-end run (tests): int4 only, 1 seed, 3 steps")
    a = ap.parse_args(argv)
    if a.smoke:
        a.steps, a.seeds, a.configs = 3, 1, "int4"
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/accuracy_int4.py " + " ".join(sys.argv[1:] if argv is None else argv)
    load0, rows = os.getloadavg(), []
    for config in a.configs.split(","):
        cfg = parse(config)
        for seed in range(a.seeds):
            r = train(cfg, seed, a.steps)
            rows.append({"config": config, "seed": seed, "steps": a.steps, **r})
            print(f"  {config} seed {seed}: fp32-eval {r['fp32_eval']:.4f} quant-eval {r['quant_eval']:.4f} "
                  f"({r['train_s']}s, load {os.getloadavg()[0]:.1f})", flush=True)
    buf = io.StringIO()
    buf.write(f"# command: {command}\n# machine load (1, 5, 15 min) before {load0}, after {os.getloadavg()}; "
              "1 thread, one process\n")
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(out / "accuracy_int4.csv", buf.getvalue())
    print(f"\n{'config':22} {'fp32-eval %':>16} {'quant-eval %':>16}")
    for config in a.configs.split(","):
        rs = [r for r in rows if r["config"] == config]
        f = lambda k: [100 * r[k] for r in rs]  # noqa: E731
        sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
        print(f"{config:22} {statistics.mean(f('fp32_eval')):9.2f} ± {sd(f('fp32_eval')):4.2f} "
              f"{statistics.mean(f('quant_eval')):9.2f} ± {sd(f('quant_eval')):4.2f}")
    print(f"machine load after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
