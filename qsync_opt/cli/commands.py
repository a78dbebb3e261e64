"""`qsync-opt`: solve | run | report | spec | devices | models | train | bench | profile | predict | indicate.

`solve`, `run`, `report` and `spec` take a job of any kind: each is a lookup in the registry (qsync_opt/jobs.py).

Exit codes: 0 ok, 2 bad input (message, no traceback), 3 infeasible, 4 `train` or `run` stopped
by a signal (SIGTERM/SIGINT) at any point (the message says what was kept and how to continue),
5 `solve --strict` whose plan misses a bound by the replayer, 1 any other failure.
With `solve --json` the plan alone goes to stdout and the readable summary to stderr, so a
scheduler can pipe it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from rich.table import Table

from qsync_opt import jobs
from qsync_opt.cli.predict import register as register_predictor_verbs
from qsync_opt.cli.spec_doc import document
from qsync_opt.console import make_console, styled
from qsync_opt.errors import InfeasibleError, ModelError, QSyncError, RuntimeSetupError, SpecError
from qsync_opt.hardware.device import catalog
from qsync_opt.io import atomic_write_text
from qsync_opt.jobs import KINDS
from qsync_opt.precision import PEAK_KEY, PRECISIONS
from qsync_opt.runtime.process_exit import Stopped, stop_on_signals
from qsync_opt.solver.backends import EXACT, available
from qsync_opt.solver.backends.base import SolveOptions
from qsync_opt.solver.backends.quiet import fd1_redirected
from qsync_opt.solver.budget import DEFAULT_TIME_LIMIT_S
from qsync_opt.solver.files import load_problem
from qsync_opt.spec.load import Override

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_STOPPED, EXIT_MISSES_BOUNDS = 0, 1, 2, 3, 4, 5


def main(argv: list[str] | None = None) -> int:
    """Run one verb and return its exit code (in-process callers and tests); `console` is the command."""
    return _run(argv)[0]


def console() -> NoReturn:
    """The `qsync-opt` console script (and `python -m qsync_opt.cli`): main(), then exit.

    A verb that leaves nothing running when it returns (`solve`: its plan is written and
    printed, its threads and solver subprocesses are done) skips the interpreter's teardown,
    which frees every object of torch (and transformers) one by one and unloads their libraries,
    a visible share of a short command (benchmarks/hf_models.py times whole commands), for
    memory the exit returns anyway. Output is flushed and atexit handlers run first; the other verbs (train,
    run: process groups, Ray, checkpoints) exit normally."""
    code, fast = _run(None)
    if fast:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed pipe (`| head`) has nothing left to flush
                stream.flush()
        atexit._run_exitfuncs()  # logging, multiprocessing and tempfile cleanups, as a normal exit runs them
        os._exit(code)
    sys.exit(code)


def _run(argv: list[str] | None) -> tuple[int, bool]:
    """(exit code, whether the verb may skip the interpreter's teardown)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT, False
    return _dispatch(args), bool(getattr(args, "fast_exit", False))


def _dispatch(args) -> int:
    err = _console(stderr=True)
    try:
        return args.func(args) or EXIT_OK
    except InfeasibleError as e:
        err.print(styled("infeasible:", "bold red", str(e)))
        return EXIT_INFEASIBLE
    except (SpecError, ModelError, RuntimeSetupError) as e:
        err.print(styled("error:", "bold red", str(e)))
        return EXIT_BAD_INPUT
    except QSyncError as e:
        err.print(styled("error:", "bold red", str(e)))
        return EXIT_FAIL
    except Stopped as e:  # train and run turn SIGTERM/SIGINT into this (runtime/process_exit.py)
        err.print(styled("stopped", "bold yellow", str(e).removeprefix("stopped ")))  # "stopped by SIGINT ..."
        return EXIT_STOPPED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `qsync-opt ... | head`
        return EXIT_OK


@contextlib.contextmanager
def _progress(console: Console, kind):
    """Print the INFO lines of the kind's progress logger (`Kind.progress_log`: a rollout plan's policies as each
    is simulated, which can take minutes) on `console`, dimmed, while the block runs; a library caller configures
    logging itself."""
    if kind.progress_log is None:
        yield
        return
    logger = kind.progress_log

    class _ToConsole(logging.Handler):
        def emit(self, record):
            console.print(styled(self.format(record), "dim"))

    lg = logging.getLogger(logger)
    handler, level = _ToConsole(logging.INFO), lg.level
    lg.addHandler(handler)
    lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        lg.removeHandler(handler)
        lg.setLevel(level)


def _console(stderr: bool = False) -> Console:
    """No markup read from messages; tables full width when piped (qsync_opt/console.py)."""
    return make_console(stderr)


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
    s.add_argument("--problem", metavar="FILE", help="solve a saved problem (.json, or .mps/.lp with its JSON twin) instead of a spec")
    s.add_argument("--verbose", action="store_true", help="also print the solver's internal notes (backend messages, timings)")
    s.add_argument("--strict", action="store_true",
                   help=f"exit {EXIT_MISSES_BOUNDS} when the plan misses a bound (meets_bounds: false) instead of 0")
    s.set_defaults(func=_cmd_solve, fast_exit=True)  # nothing runs after a plan is printed (console)

    d = sub.add_parser("devices", help="list the device catalog")
    d.set_defaults(func=_cmd_devices)

    m = sub.add_parser("models", help="list the model zoo")
    m.set_defaults(func=_cmd_models)

    sp = sub.add_parser("spec", help="document every field of a job spec, for every kind (or one: --kind)")
    sp.add_argument("--kind", choices=tuple(KINDS),
                    help="document this kind's spec only (default: every kind)")
    sp.set_defaults(func=_cmd_spec)

    t = sub.add_parser("train", help="train with a plan on torch.distributed (one process per device); "
                       "also runs as one rank under torchrun")
    t.add_argument("spec")
    t.add_argument("--plan", required=True, help="plan file from `qsync-opt solve -o`")
    t.add_argument("--steps", type=int)
    t.add_argument("--checkpoint-dir")
    t.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints (default 10)")
    t.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint")
    t.add_argument("--metrics-dir", help="where ranks write rank<r>.jsonl and result.json")
    t.add_argument("--start-timeout", type=float, metavar="S",
                   help="seconds every rank may take to start and meet at the rendezvous (default 120)")
    t.add_argument("--force", action="store_true", help="apply a plan solved for another model graph")
    t.add_argument("--threads", type=int, metavar="N", help="CPU threads per rank (default: CPUs / ranks)")
    t.add_argument("--json", action="store_true", help="print the JSON result alone on stdout")
    t.add_argument("--emulate", action="store_true", help="train groups whose device is not here on this CPU even when "
                   "that is expected >10x slower (runtime.emulate: true in the spec does the same)")
    t.set_defaults(func=_cmd_train)

    r = sub.add_parser("run", help="the spec's kind through its stages into a folder: " + "; ".join(
        f"{k.name}: {' -> '.join(k.stages)}" for k in KINDS.values()))
    r.add_argument("spec")
    r.add_argument("-o", "--output", required=True, help="folder for the stages' artefacts, train/, report.md and PNGs")
    r.add_argument("--from", dest="start", help="rerun from this stage (" + "; ".join(
        f"{k.name}: {' | '.join(k.stages)}" for k in KINDS.values() if "start" in k.run_options) + ")")
    r.add_argument("--steps", type=int, help="steps to run (default: the spec's training.steps, rollout.steps or, for loading, steps)")
    r.add_argument("--emulate", action="store_true", help="as for train: emulate absent devices even when >10x slower")
    r.add_argument("--real", action="store_true", help="rollout spec: also run every policy here on Ray actors (extra "
                   "'rollout') and write measured.csv beside the simulator calibrated from that run")
    r.add_argument("--rounds", type=int, default=1, help="rollout --real: interleaved rounds of every policy (default 1)")
    r.set_defaults(func=_cmd_run)

    rp = sub.add_parser("report", help="print a saved plan of any kind (a file from `solve -o`, or a `run` folder)")
    rp.add_argument("plan", help="plan file (.json or .yaml), or the output folder of `qsync-opt run`")
    rp.add_argument("--verbose", action="store_true", help="also print the solver's internal notes")
    rp.set_defaults(func=_cmd_report)

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(metavar="WHAT")
    bs = bsub.add_parser("solvers", help="time every backend on zoo and synthetic instances")
    bs.add_argument("--instances", help="directory of saved problem JSON files to include")
    bs.add_argument("--out", default="results", help="directory for CSV and PNG")
    bs.add_argument("--quick", action="store_true", help="resnet18 on three clusters, synthetic 50 and 300 ops, 5 s limit, plus a 0.05 s limit check (< 5 min)")
    bs.add_argument("--models", help="comma-separated zoo models (default: all; 'none' for synthetic only)")
    bs.add_argument("--sizes", help="comma-separated synthetic sizes (default 50,200,1000,5000)")
    bs.add_argument("--backends", help="comma-separated backends (default: all available)")
    bs.add_argument("--limit", type=float, default=DEFAULT_TIME_LIMIT_S, help=f"time limit per solve, s (default {DEFAULT_TIME_LIMIT_S:g})")
    bs.add_argument("--gap", type=float, default=1e-3, help="relative gap")
    bs.add_argument("--formulations", help="comma-separated cast linearisations: mccormick (products), marginal (arcs)")
    bs.add_argument("--kinds", help="comma-separated synthetic kinds (default chain,dag)")
    bs.add_argument("--name", default="solvers", help="file stem of the CSV and PNG (default solvers)")
    bs.add_argument("--limit-check", type=float, help="also time a whole no-plan call under this limit (--quick: 0.05)")
    bs.set_defaults(func=_cmd_bench_solvers)

    register_predictor_verbs(sub)  # profile | predict | indicate
    return p


def _cmd_solve(args) -> int:
    out = _console(stderr=args.json)
    overrides, flags = {}, {}
    for flag, key, value in (("--backend", "solver.backend", args.backend),
                             ("--time-limit", "solver.time_limit_s", args.time_limit),
                             ("--gap", "solver.rel_gap", args.gap)):
        if value is not None:
            overrides[key], flags[key] = value, f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"
    if args.problem:
        return _solve_problem(args, overrides, out)
    if not args.spec:
        raise SpecError("solve needs a SPEC path (or --problem FILE)")
    # an error in a flag's value names the flag, not the spec line it replaces
    job = jobs.load_spec(args.spec, **{key: Override(value, flags[key]) for key, value in overrides.items()})
    kind = jobs.kind_of_job(job)
    # with --json, whatever a library prints from C goes to stderr: stdout carries the plan alone
    with fd1_redirected(2) if args.json else contextlib.nullcontext(), _progress(_console(stderr=True), kind):
        plan = jobs.solve(job, export_problem=args.export_problem)
    kind.report(plan, out, verbose=args.verbose)
    if args.output:
        out.print(f"plan written to {plan.save(args.output)}")
    if args.json:
        sys.stdout.write(plan.to_json() + "\n")
    if plan.meets_bounds is False:
        _console(stderr=True).print(styled("warning:", "bold yellow", "the plan misses a bound (meets_bounds: false); "
                                           "see the solver notes"))
        if args.strict:
            return EXIT_MISSES_BOUNDS
    return EXIT_OK


def _solve_problem(args, overrides: dict, out) -> int:
    """`solve --problem FILE`: re-solve a saved program; -o writes and --json prints the result."""
    from qsync_opt.training.program.solve import DEFAULT_BACKEND, solve_problem  # import cost: the program compiler

    backend = overrides.get("solver.backend", "default")
    allowed = [*EXACT, "greedy", "default"]
    if backend not in allowed:
        why = (" ('uniform' is a policy over the model's operators, which a saved problem no longer has)"
               if backend == "uniform" else "")
        raise SpecError(f"--backend: {backend!r} cannot solve a saved problem{why}; use one of {', '.join(allowed)}")
    if not Path(args.problem).exists():
        raise SpecError(f"--problem: file {args.problem!r} does not exist; write one with "
                        "`qsync-opt solve SPEC --export-problem p.json`")
    problem = load_problem(args.problem)
    backend = DEFAULT_BACKEND if backend == "default" else backend
    if not available().get(backend, False):
        raise SpecError(f"--backend: {backend!r} is not installed here; available: "
                        + ", ".join(n for n, ok in available().items() if ok))
    opts = SolveOptions(time_limit_s=overrides.get("solver.time_limit_s", DEFAULT_TIME_LIMIT_S),
                        rel_gap=overrides.get("solver.rel_gap", 1e-4))
    if args.json:
        with fd1_redirected(2):
            r = solve_problem(problem, backend, opts)
    else:
        r = solve_problem(problem, backend, opts)
    gap = "" if r.gap is None else f", gap {r.gap:.3%}"
    out.print(f"{args.problem}: {r.backend} -> {r.status}, objective {r.objective:.9g} (plan units){gap}, "
              f"build {r.build_s * 1000:.0f} ms, solve {r.solve_s * 1000:.0f} ms", highlight=False)
    if problem.source is not None:
        out.print(f"plan checked against the instance: {len(r.assignment)} groups, "
                  + ", ".join(f"{g}: {len(ops)} ops" for g, ops in r.assignment.items()), highlight=False)
    elif not problem.choices:
        out.print("no JSON twin beside the file: objective and status only (no plan to decode)", highlight=False)
    result = {"problem": str(args.problem), "backend": r.backend, "status": r.status, "objective": r.objective,
              "bound": r.bound, "gap": r.gap, "wall_s": r.wall_s, "assignment": r.assignment}
    text = json.dumps(result, indent=2) + "\n"
    if args.output:
        out.print(f"result written to {atomic_write_text(args.output, text)}")
    if args.json:
        sys.stdout.write(text)
    return EXIT_OK


def _cmd_devices(args) -> int:
    # columns are the precision names a spec and a plan use (fp8_e4m3 and fp8_e5m2 share one rate)
    t = Table(title="device catalog (dense peak TFLOP/s or TOP/s; '-' = no native path)", title_justify="left")
    for col in ("device", "memory GB", "GB/s", *PRECISIONS, "source"):
        t.add_column(col, justify="left" if col in ("device", "source") else "right")
    for name, dev in catalog().items():
        t.add_row(
            name,
            f"{dev.memory_gb:g}",
            f"{dev.bandwidth_gbs:g}",
            *(f"{dev.peak_tflops[PEAK_KEY[p]]:g}" if dev.supports(p) else "-" for p in PRECISIONS),
            dev.source,
        )
    _console().print(t)
    return EXIT_OK


def _cmd_models(args) -> int:
    from qsync_opt.cli.models import summary  # import cost: torch (the zoo's modules are built to count them)
    from qsync_opt.models.zoo import ZOO  # import cost: torch

    t = Table(title="model zoo (random weights, no downloads)", title_justify="left",
              caption="operators: the Linear/Conv/Embedding modules a plan gives a precision (functional matmuls "
                      "the tracer finds, e.g. attention, come on top; `solve` counts them all)", caption_justify="left")
    for col in ("name", "task", "input (B = batch)", "operators", "description"):
        t.add_column(col, justify="right" if col == "operators" else "left")
    for name in ZOO:
        row = summary(name)
        t.add_row(name, row.task, row.input, str(row.operators), row.description)
    _console().print(t)
    return EXIT_OK


def _cmd_spec(args) -> int:
    print(document([args.kind] if args.kind else list(KINDS)))
    return EXIT_OK


def _cmd_train(args) -> int:
    if args.start_timeout is not None and args.start_timeout <= 0:
        raise SpecError(f"--start-timeout: got {args.start_timeout:g}; give a positive number of seconds")
    if args.threads is not None and args.threads < 1:
        raise SpecError(f"--threads: got {args.threads}; give a positive number of threads per rank")
    if args.steps is not None and args.steps < 1:
        raise SpecError(f"--steps: got {args.steps}; give a positive number of steps (default: training.steps)")
    if args.checkpoint_every < 0:
        raise SpecError(f"--checkpoint-every: got {args.checkpoint_every}; give 0 (only at the end) or more")
    from qsync_opt.training.runtime.torchrun import train_rank, under_torchrun  # import cost: torch.distributed

    if under_torchrun():
        return train_rank(args)
    with stop_on_signals():  # a stop at any point is exit 4 (launch says what was kept)
        from qsync_opt.training.runtime.launch import launch  # import cost: torch.distributed and the runtime

        return launch(args.spec, args.plan, steps=args.steps, checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                      checkpoint_every=args.checkpoint_every, metrics_dir=args.metrics_dir,
                      start_timeout_s=args.start_timeout, force=args.force, as_json=args.json, threads=args.threads,
                      emulate=args.emulate)


def _cmd_run(args) -> int:
    with stop_on_signals():  # SIGTERM/SIGINT at any stage: `Stopped`, exit 4 (_dispatch)
        kind = jobs.kind(jobs.kind_of_file(args.spec))
        with _progress(_console(stderr=True), kind):
            paths = jobs.run(args.spec, args.output, steps=args.steps, start=args.start, emulate=args.emulate,
                             real=args.real, rounds=args.rounds, console=_console())
    out = _console()
    for what, path in paths.items():
        out.print(f"{what}: {path}", highlight=False)
    return EXIT_OK


def _cmd_report(args) -> int:
    path = Path(args.plan)
    if path.is_dir() and (path / "plan.json").is_file():  # a `qsync-opt run` folder
        path = path / "plan.json"
    kind, plan = jobs.load_plan(path)
    kind.report(plan, _console(), verbose=args.verbose)
    return EXIT_OK


def _cmd_bench_solvers(args) -> int:
    from qsync_opt.training.bench_solvers import run_benchmark  # import cost: matplotlib

    split = lambda text, conv=str: [conv(x) for x in text.split(",")] if text else None  # noqa: E731
    run_benchmark(out_dir=Path(args.out), instances_dir=args.instances, quick=args.quick,
                  models=split(args.models), sizes=split(args.sizes, int), backends=split(args.backends),
                  limit=args.limit, gap=args.gap, formulations=split(args.formulations), kinds=split(args.kinds),
                  command=" ".join(shlex.quote(a) for a in sys.argv), name=args.name, limit_check=args.limit_check)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
