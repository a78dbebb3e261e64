"""Regenerate the pictures in docs/img/ from the README's example and from ResNet-50, on this code.

    python benchmarks/report_pictures.py [--out docs/img] [--work DIR]

1. `qsync-opt run examples/cpu_tiny.yaml -o WORK/cpu_tiny` (profile, indicate, solve, predict,
   train, report: the README's example, run for real on this machine) -> cpu_tiny_precisions.png,
   cpu_tiny_curves.png, cpu_tiny_timeline.png, and its report.md printed (the README's sample).
2. `qsync-opt solve examples/hybrid_v100_t4_resnet50.yaml` and `qsync-opt predict ... --png`
   (planned only: the V100 and T4 are not here, so nothing is trained) -> resnet50_precisions.png
   and resnet50_timeline.png.
The command, the machine load before and after, and the files written are printed; each PNG
should be looked at after a change to how it is drawn.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> None:
    cmd = [sys.executable, "-m", "qsync_opt.cli", *args]
    print("$ qsync-opt " + " ".join(shlex.quote(a) for a in args), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "img"), help="where the PNGs go (default docs/img)")
    p.add_argument("--work", help="folder for the runs' artefacts (default: a fresh temporary folder)")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work or tempfile.mkdtemp(prefix="qsync-pictures-"))
    print(f"# {' '.join(map(shlex.quote, sys.argv))}; load before {os.getloadavg()}", flush=True)

    tiny = work / "cpu_tiny"
    _cli("run", "examples/cpu_tiny.yaml", "-o", str(tiny))
    for name in ("precisions", "curves", "timeline"):
        shutil.copyfile(tiny / f"{name}.png", out / f"cpu_tiny_{name}.png")

    plan = work / "resnet50_plan.json"
    _cli("solve", "examples/hybrid_v100_t4_resnet50.yaml", "-o", str(plan))
    _cli("predict", "examples/hybrid_v100_t4_resnet50.yaml", "--plan", str(plan),
         "--png", str(out / "resnet50_timeline.png"))
    from qsync_opt.training.plan import Plan
    from qsync_opt.training.run_report import precision_strip
    from qsync_opt.training.spec import load_spec

    spec = load_spec(ROOT / "examples" / "hybrid_v100_t4_resnet50.yaml")
    precision_strip(Plan.load(plan), out / "resnet50_precisions.png", [g.name for g in spec.cluster.groups])

    print(f"\n# load after {os.getloadavg()}; wrote " + ", ".join(sorted(x.name for x in out.glob("*.png"))))
    print(f"\n# {tiny / 'report.md'}:\n")
    print((tiny / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
