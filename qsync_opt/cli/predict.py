"""`qsync-opt profile | predict | indicate`: measure the device, replay a plan, compute ω.

Registered on the main parser by `register(sub)`; each verb is a thin wrapper over a library
function, so schedulers can call the same code without the CLI.
"""

from __future__ import annotations

import json

from rich.table import Table

from qsync_opt import jobs
from qsync_opt.console import make_console
from qsync_opt.errors import SpecError
from qsync_opt.io import atomic_write_text
from qsync_opt.spec.load import Override
from qsync_opt.training.spec import load_spec


def register(sub) -> None:
    p = sub.add_parser("profile", help="measure the runtime's kernels on this machine for a spec's groups (training: per op; serving: per layer)")
    p.add_argument("spec")
    p.add_argument("-o", "--output", help="profile file (default: this machine's cached profile)")
    p.add_argument("--groups", help="comma-separated groups to profile (default: every group that runs here)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_profile)

    r = sub.add_parser("predict", help="replay a plan: lockstep iteration time, per-group breakdown, timeline")
    r.add_argument("spec")
    r.add_argument("--plan", required=True, help="plan file from `qsync-opt solve -o`")
    r.add_argument("--trace", help="write a Chrome trace (JSON; opens in Perfetto)")
    r.add_argument("--png", help="write the timeline as a PNG")
    r.set_defaults(func=cmd_predict)

    i = sub.add_parser("indicate", help="compute the spec's sensitivity indicator (cached) and show it")
    i.add_argument("spec")
    i.add_argument("--method", help="auto | weight | gvar | hessian | empirical (default: the spec's indicator.method)")
    i.add_argument("-o", "--output", help="write ω as JSON")
    i.add_argument("--top", type=int, default=15, help="rows to show")
    i.set_defaults(func=cmd_indicate)


def _console():
    return make_console()


def cmd_profile(args) -> int:
    out = _console()
    k = jobs.kind(jobs.kind_of_file(args.spec))
    if k.profile is None:
        measured = " and ".join(n for n, x in jobs.KINDS.items() if x.profile is not None)
        raise SpecError(f"{args.spec}: kind: {k.name}: `qsync-opt profile` measures the costs of {measured} specs; "
                        f"a {k.name} spec has nothing to profile here: plan it with `qsync-opt solve {args.spec}`")
    k.profile(jobs.load_spec(args.spec), args.output, args.groups.split(",") if args.groups else None, out,
              progress=not args.quiet)
    return 0


def cmd_predict(args) -> int:
    from qsync_opt.training import run_stages  # import cost: torch (the plan is replayed on the traced model)
    from qsync_opt.training.predictor.timeline_export import write_chrome_trace, write_png  # import cost: matplotlib

    out = _console()
    spec, ctx, tl = run_stages.predict_plan(args.spec, args.plan)
    t = Table(title=f"{spec.name}: predicted lockstep iteration {tl.iteration_ms:.2f} ms", title_justify="left")
    for col in ("group", "forward", "backward", "casts", "optimizer", "exposed comm", "idle (stragglers)",
                "own iteration", "costs"):
        t.add_column(col, justify="left" if col in ("group", "costs") else "right")
    for gc in ctx.groups:
        g = tl.groups[gc.name]
        t.add_row(gc.name, f"{g.forward_ms:.2f}", f"{g.backward_ms:.2f}", f"{g.cast_ms + g.weight_cast_ms:.2f}",
                  f"{g.optimizer_ms:.2f}", f"{g.comm_exposed_ms:.2f}", f"{tl.idle_ms[gc.name]:.2f}",
                  f"{g.iteration_ms:.2f}", gc.cost_source)
    out.print(t)
    if args.trace:
        out.print(f"Chrome trace written to {write_chrome_trace(tl, args.trace)} (open in https://ui.perfetto.dev)")
    if args.png:
        out.print(f"timeline written to {write_png(tl, args.png, f'{spec.name}: {tl.iteration_ms:.2f} ms per iteration')}")
    return 0


def cmd_indicate(args) -> int:
    from qsync_opt.training.predictor.indicators import compute_indicator  # import cost: the indicators' autograd

    out = _console()

    overrides = {"indicator.method": Override(args.method, f"--method {args.method}")} if args.method else {}
    spec = load_spec(args.spec, **overrides)
    sens, note = compute_indicator(spec, log=lambda s: out.print(s, highlight=False), progress=True)
    out.print(note)
    ps = list(next(iter(sens.omega.values())))
    t = Table(title=f"ω ({spec.indicator.method}), largest first", title_justify="left")
    t.add_column("op")
    for p in ps:
        t.add_column(p, justify="right")
    rows = sorted(sens.omega.items(), key=lambda kv: -max(kv[1].values()))
    for op, w in rows[: args.top]:
        t.add_row(op, *(f"{w.get(p, 0.0):.4g}" for p in ps))
    out.print(t)
    if args.output:
        atomic_write_text(args.output, json.dumps({"method": spec.indicator.method, "omega": sens.omega}, indent=1))
        out.print(f"ω written to {args.output}")
    return 0
