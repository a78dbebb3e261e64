"""What a process pays to plan one job through `qsync_opt.solve`: wall seconds, peak memory, and whether torch was
imported, for this tree against an older commit, side by side.

A cluster scheduler that embeds the planner calls `import qsync_opt; qsync_opt.solve(spec)` in its own process.
Each round runs, per example spec, the old code then the new (A B A B ...) in a fresh process each:
`python -c "import qsync_opt; qsync_opt.solve(SPEC)"`, with the package under test first on PYTHONPATH and as the
working directory. The old code is `git archive REV qsync_opt` unpacked into a temporary folder.

    PYTHONPATH=. python benchmarks/plan_import_cost.py --out DIR [--rounds 3] [--old 3c73fb2] [--specs a.yaml ...]

Writes DIR/plan_import_cost.csv (per spec: the median wall and peak RSS of each side, their ratios, torch imported
or not; the command, CPU model and machine load in its header) and prints the table.

Then the same for CLI commands that plan nothing (`qsync-opt --help`, `devices`; --no-cli leaves them out).

--smoke: one round of the loading example and `qsync-opt --help`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_table import load_now, write_table  # noqa: E402

#: The last commit whose `import qsync_opt` imported every kind (and torch with the training kind).
OLD = "3c73fb2"
SPECS = ("examples/serving_opt30b_t4_v100.yaml", "examples/rollout_cpu_tiny.yaml", "examples/loading_cpu_mix.yaml",
         "examples/hybrid_v100_t4_resnet50.yaml")
#: CLI commands timed the same way (`python -m qsync_opt.cli ARGS`), after the specs.
COMMANDS = (("--help",), ("devices",))
CODE = ("import sys, qsync_opt\n"
        "p = qsync_opt.solve(sys.argv[1])\n"
        "print(type(p).__name__, 'torch' in sys.modules)\n")


def export(rev: str, into: Path) -> Path:
    """`git archive rev qsync_opt` unpacked under `into`; exit 2 naming --old when git cannot."""
    arc = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "qsync_opt"], capture_output=True)
    if arc.returncode != 0:
        raise SystemExit(f"error: --old {rev}: git archive failed ({arc.stderr.decode().strip()}); give a commit of "
                         "this repository's history (a shallow clone may lack it)")
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=arc.stdout, check=True)
    return into


def argv_of(job: "Path | tuple[str, ...]", probe: str = CODE) -> list[str]:
    """The process that plans `job` (a spec path) or runs the CLI command `job` (a tuple), printing what `probe`
    prints at its end."""
    if isinstance(job, tuple):
        cli = ("import sys\nfrom qsync_opt.cli.commands import main\n"
               "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n")
        tail = probe.split("\n", 2)[2].replace("type(p).__name__", "'cli'")
        return [sys.executable, "-c", cli + tail, *job]
    return [sys.executable, "-c", probe, str(job)]


def once(code: Path, spec: "Path | tuple[str, ...]") -> tuple[float, bool, str]:
    """(wall s, torch imported, plan type) of one fresh process planning `spec` (or running a CLI command) with the
    package under `code`."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    t = time.perf_counter()
    p = subprocess.run(argv_of(spec), cwd=code, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"error: planning {spec} with {code} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    plan, torch = p.stdout.split()[-2:]
    return wall, torch == "True", plan


def peak_rss_mib(code: Path, spec: Path) -> float:
    """Peak RSS (MiB) of one process planning `spec`, as the process itself reports it (getrusage)."""
    probe = CODE.replace("print(type(p).__name__, 'torch' in sys.modules)",
                         "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    env = {**os.environ, "PYTHONPATH": str(code)}
    p = subprocess.run(argv_of(spec, probe), cwd=code, env=env, capture_output=True, text=True, timeout=600,
                       check=True)
    return int(p.stdout.split()[-1]) / 1024


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for plan_import_cost.csv")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old", default=OLD, help=f"the commit to compare with (default {OLD})")
    ap.add_argument("--specs", nargs="+", default=list(SPECS))
    ap.add_argument("--no-cli", dest="commands", action="store_const", const=(), default=COMMANDS,
                    help="leave out the CLI commands (qsync-opt --help, devices)")
    ap.add_argument("--smoke", action="store_true", help="one round of the loading example")
    a = ap.parse_args(argv)
    if a.smoke:
        a.rounds, a.specs, a.commands = 1, ["examples/loading_cpu_mix.yaml"], (("--help",),)
    if a.rounds < 1:
        raise SystemExit(f"error: --rounds {a.rounds}: give at least 1")
    load = load_now()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        old = export(a.old, Path(d) / "old")
        jobs = [(s, (ROOT / s).resolve()) for s in a.specs] + [(f"qsync-opt {' '.join(c)}", c) for c in a.commands]
        for s, spec in jobs:
            if isinstance(spec, Path) and not spec.is_file():
                raise SystemExit(f"error: --specs {s}: no such file")
            walls, torch = {"old": [], "new": []}, {}
            for _ in range(a.rounds):
                for side, code in (("old", old), ("new", ROOT)):
                    w, torch[side], plan = once(code, spec)
                    walls[side].append(w)
            rss = {side: peak_rss_mib(code, spec) for side, code in (("old", old), ("new", ROOT))}
            wo, wn = statistics.median(walls["old"]), statistics.median(walls["new"])
            rows.append({"spec": s, "plan": plan, "old_s": f"{wo:.2f}", "new_s": f"{wn:.2f}",
                         "speedup": f"{wo / wn:.2f}", "old_rss_mib": f"{rss['old']:.0f}",
                         "new_rss_mib": f"{rss['new']:.0f}", "rss_ratio": f"{rss['new'] / rss['old']:.2f}",
                         "torch_old": torch["old"], "torch_new": torch["new"], "rounds": a.rounds})
    cols = ["spec", "plan", "old_s", "new_s", "speedup", "old_rss_mib", "new_rss_mib", "rss_ratio", "torch_old",
            "torch_new", "rounds"]
    path = write_table(Path(a.out) / "plan_import_cost.csv", "plan_import_cost.py", argv, cols, rows, load)
    print(f"old {a.old} vs this tree; medians of {a.rounds} fresh processes each, alternating")
    print("  ".join(f"{c:>12}" if c != "spec" else f"{c:<42}" for c in cols))
    for r in rows:
        print("  ".join(f"{str(r[c]):>12}" if c != "spec" else f"{r[c]:<42}" for c in cols))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
