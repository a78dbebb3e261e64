"""`qsync-opt`: solve | devices | models | spec | train | bench.

Exit codes: 0 ok, 2 bad input (message, no traceback), 3 infeasible, 1 any other failure.
With `solve --json` the plan alone goes to stdout and the readable summary to stderr, so a
scheduler can pipe it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .errors import InfeasibleError, ModelError, QSyncError, SpecError

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    err = _console(stderr=True)
    try:
        return args.func(args) or EXIT_OK
    except InfeasibleError as e:
        err.print(f"[bold red]infeasible:[/bold red] {e}", highlight=False)
        return EXIT_INFEASIBLE
    except (SpecError, ModelError) as e:
        err.print(f"[bold red]error:[/bold red] {e}", highlight=False)
        return EXIT_BAD_INPUT
    except QSyncError as e:
        err.print(f"[bold red]error:[/bold red] {e}", highlight=False)
        return EXIT_FAIL
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `qsync-opt ... | head`
        return EXIT_OK


def _console(stderr: bool = False) -> Console:
    """A console that stays readable when piped (rich would shrink tables to 80 columns)."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=160)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qsync-opt", description="Mixed-precision plans for clusters of unlike accelerators.")
    sub = p.add_subparsers(metavar="COMMAND")

    s = sub.add_parser("solve", help="plan a job spec (or re-solve an exported problem)")
    s.add_argument("spec", nargs="?", help="job spec YAML")
    s.add_argument("-o", "--output", help="write the plan here (.json or .yaml), atomically")
    s.add_argument("--backend", help="cbc | highs | cpsat | scip | greedy | uniform | default")
    s.add_argument("--time-limit", type=float, help="solver time limit in seconds")
    s.add_argument("--gap", type=float, help="relative optimality gap")
    s.add_argument("--json", action="store_true", help="print the plan JSON alone on stdout")
    s.add_argument("--export-problem", metavar="FILE", help="also save the integer program (.json, .mps or .lp)")
    s.add_argument("--problem", metavar="FILE", help="solve a saved problem JSON instead of a spec")
    s.set_defaults(func=_cmd_solve)

    d = sub.add_parser("devices", help="list the device catalog")
    d.set_defaults(func=_cmd_devices)

    m = sub.add_parser("models", help="list the model zoo")
    m.set_defaults(func=_cmd_models)

    sp = sub.add_parser("spec", help="document every field of a job spec")
    sp.set_defaults(func=_cmd_spec)

    t = sub.add_parser("train", help="train with a plan on torch.distributed (one process per device)")
    t.add_argument("spec")
    t.add_argument("--plan", required=True, help="plan file from `qsync-opt solve -o`")
    t.add_argument("--steps", type=int)
    t.add_argument("--checkpoint-dir")
    t.add_argument("--resume", action="store_true")
    t.set_defaults(func=_cmd_train)

    r = sub.add_parser("run", help="solve -> train -> report; each stage's artefact cached in the output folder")
    r.add_argument("spec")
    r.add_argument("-o", "--output", required=True, help="folder for plan.json, train/, report.md and PNGs")
    r.add_argument("--from", dest="start", help="rerun from this stage: solve | train | report")
    r.add_argument("--steps", type=int, help="training steps (default: training.steps)")
    r.set_defaults(func=_cmd_run)

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(metavar="WHAT")
    bs = bsub.add_parser("solvers", help="time every backend on zoo and synthetic instances")
    bs.add_argument("--instances", help="directory of saved problem JSON files to include")
    bs.add_argument("--out", default="results", help="directory for CSV and PNG")
    bs.add_argument("--quick", action="store_true", help="small models, synthetic sizes up to 1,000")
    bs.add_argument("--models", help="comma-separated zoo models (default: all)")
    bs.add_argument("--sizes", help="comma-separated synthetic sizes (default 50,200,1000,5000)")
    bs.add_argument("--backends", help="comma-separated backends (default: all available)")
    bs.add_argument("--limit", type=float, default=60.0, help="time limit per solve, s")
    bs.add_argument("--gap", type=float, default=1e-3, help="relative gap")
    bs.set_defaults(func=_cmd_bench_solvers)
    return p


def _cmd_solve(args) -> int:
    from . import pipeline
    from .report import print_plan

    out = _console(stderr=args.json)
    overrides = {}
    if args.backend:
        overrides["solver.backend"] = args.backend
    if args.time_limit:
        overrides["solver.time_limit_s"] = args.time_limit
    if args.gap is not None:
        overrides["solver.rel_gap"] = args.gap
    if args.problem:
        return pipeline.solve_saved_problem(args.problem, overrides, out)
    if not args.spec:
        raise SpecError("solve needs a SPEC path (or --problem FILE)")
    if args.json:  # whatever a library prints from C, stdout carries the plan alone
        from .solver.backends.quiet import fd1_redirected

        with fd1_redirected(2):
            plan = pipeline.solve(args.spec, export_problem=args.export_problem, **overrides)
    else:
        plan = pipeline.solve(args.spec, export_problem=args.export_problem, **overrides)
    print_plan(plan, out)
    if args.output:
        path = plan.save(args.output)
        out.print(f"plan written to {path}")
    if args.json:
        sys.stdout.write(plan.to_json() + "\n")
    return EXIT_OK


def _cmd_devices(args) -> int:
    from .hardware.device import catalog
    from .precision import PRECISIONS, PEAK_KEY

    keys = list(dict.fromkeys(PEAK_KEY[p] for p in PRECISIONS))
    t = Table(title="device catalog (dense peak TFLOP/s or TOP/s; '-' = no native path)", title_justify="left")
    for col in ("device", "memory GB", "GB/s", *keys, "source"):
        t.add_column(col, justify="left" if col in ("device", "source") else "right")
    for name, dev in catalog().items():
        t.add_row(
            name,
            f"{dev.memory_gb:g}",
            f"{dev.bandwidth_gbs:g}",
            *(f"{dev.peak_tflops[k]:g}" if k in dev.peak_tflops else "-" for k in keys),
            dev.source,
        )
    _console().print(t)
    return EXIT_OK


def _cmd_models(args) -> int:
    from .models.zoo import ZOO

    t = Table(title="model zoo (random weights, no downloads)", title_justify="left")
    t.add_column("name")
    t.add_column("task")
    for name, entry in ZOO.items():
        t.add_row(name, getattr(entry, "task", ""))
    _console().print(t)
    return EXIT_OK


def _cmd_spec(args) -> int:
    from pydantic import BaseModel

    from .spec import JobSpec
    from .spec_errors import model_in

    def walk(model: type[BaseModel], prefix: str, seen: set) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{field.alias or name}"
            default = "" if field.is_required() else f" (default: {field.get_default(call_default_factory=True)!r})"
            print(f"{key}{default}\n    {field.description or ''}".rstrip())
            nested = model_in(field.annotation)
            if nested is not None and nested not in seen:
                walk(nested, key + ".", seen | {nested})

    walk(JobSpec, "", set())
    return EXIT_OK


def _cmd_train(args) -> int:
    from .runtime.launch import launch

    return launch(args.spec, args.plan, steps=args.steps, checkpoint_dir=args.checkpoint_dir, resume=args.resume)


def _cmd_run(args) -> int:
    from .run import run

    stages = run(args.spec, args.output, start=args.start, steps=args.steps)
    print(f"report: {stages['report']}")
    return EXIT_OK


def _cmd_bench_solvers(args) -> int:
    from .solver.bench import run_benchmark

    split = lambda text, conv=str: [conv(x) for x in text.split(",")] if text else None  # noqa: E731
    run_benchmark(out_dir=Path(args.out), instances_dir=args.instances, quick=args.quick,
                  models=split(args.models), sizes=split(args.sizes, int), backends=split(args.backends),
                  limit=args.limit, gap=args.gap)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
