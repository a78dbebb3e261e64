"""Fit the roofline's achieved-efficiency factors on every committed GPU run.

Reads benchmarks/results/gpu/*-gpu-check-results.json (benchmarks/gpu_check.py's record of a lent
GPU), computes for each (sm, precision, op kind) the achieved fraction of the catalog peak of the
runtime module measured there (qsync_opt/hardware/calibration.py says exactly what and how), and
writes qsync_opt/hardware/calibration.yaml, which prices every device of that architecture that
is not present. Every later GPU run adds its file and reruns this.

    python benchmarks/fit_calibration.py                      # refit the package's calibration.yaml
    python benchmarks/fit_calibration.py --check              # exit 1 if calibration.yaml is stale
    python benchmarks/fit_calibration.py --smoke --out F      # the same fit, written to F only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "gpu"
PACKAGE_FILE = ROOT / "qsync_opt" / "hardware" / "calibration.yaml"


def fitted_text(results: Path = RESULTS) -> tuple[str, list[str], int]:
    """(calibration.yaml text, skipped rows, files read) from the results folder."""
    from qsync_opt.hardware.calibration import RESULTS_GLOB
    from qsync_opt.hardware.calibration_fit import fit_files, render

    files = sorted(results.glob(RESULTS_GLOB))
    factors, skipped = fit_files(files, ROOT)
    return render(factors), skipped, len(files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of *-gpu-check-results.json")
    ap.add_argument("--out", type=Path, default=None, help=f"where to write (default {PACKAGE_FILE.relative_to(ROOT)})")
    ap.add_argument("--smoke", action="store_true", help="fit the committed files and write to --out only")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the package file differs")
    args = ap.parse_args(argv)
    from qsync_opt.hardware.calibration import CalibrationError
    from qsync_opt.io import atomic_write_text

    if args.smoke and args.out is None:
        print("error: --smoke needs --out FILE or FOLDER (it never rewrites the package's calibration.yaml)", file=sys.stderr)
        return 2
    if not args.results.is_dir():
        print(f"error: --results {args.results}: no such folder", file=sys.stderr)
        return 2
    try:
        text, skipped, n = fitted_text(args.results)
    except CalibrationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)
    if args.check:
        same = PACKAGE_FILE.is_file() and PACKAGE_FILE.read_text() == text
        print(f"{PACKAGE_FILE.relative_to(ROOT)} {'matches' if same else 'DIFFERS from'} the fit of {n} file(s)")
        return 0 if same else 1
    out = args.out or PACKAGE_FILE
    if args.smoke or out.is_dir():  # a smoke run's --out is a folder, as every benchmark's
        out.mkdir(parents=True, exist_ok=True)
        out = out / PACKAGE_FILE.name
    atomic_write_text(out, text)
    print(f"wrote {out}: {text.count('- sm:')} factors from {n} file(s) in {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
