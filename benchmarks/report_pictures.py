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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="where the PNGs go (default docs/img)")
    p.add_argument("--work", help="folder for the runs' artefacts (default: a fresh temporary folder)")
    p.add_argument("--smoke", action="store_true",
                   help="smallest end-to-end run (tests): the example in fp32 only, trained 3 steps, the "
                        "profiler at its fewest calls; needs --out (docs/img keeps the real run's pictures)")
    a = p.parse_args(argv)
    if a.smoke and a.out is None:
        p.error("--smoke needs --out DIR: a smoke run never writes docs/img")
    a.out = a.out or str(ROOT / "docs" / "img")
    steps, tiny_spec = [], "examples/cpu_tiny.yaml"
    work = Path(a.work or tempfile.mkdtemp(prefix="qsync-pictures-"))
    if a.smoke:  # the run's profiler subprocesses inherit this; its rough profile stays in WORK, out of the user's cache
        from _smoke import rough_profiles, tiny_spec as smoke_spec

        steps, tiny_spec = ["--steps", "3"], str(smoke_spec(work))
        rough_profiles(work / "profiles")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"# {' '.join(map(shlex.quote, sys.argv))}; load before {os.getloadavg()}", flush=True)

    tiny = work / "cpu_tiny"
    _cli("run", tiny_spec, "-o", str(tiny), *steps)
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
