"""CBC through PuLP's bundled binary.

PuLP maps a CBC run stopped on time *with* a plan to status "Optimal"; the solution status
(`prob.sol_status`) tells the truth, and the CBC log gives the best bound, so both are read.
Warm start: PuLP writes the greedy plan as a MIP start (warmStart=True + setInitialValue).
"""

from __future__ import annotations

import os
import re
import tempfile
import time

from qsync_opt.solver.backends.base import RawResult, SolveOptions, prologue, result_from_values, seconds_left
from qsync_opt.solver.backends.pulp_model import build_pulp, pulp_values
from qsync_opt.solver.problem import Problem

name = "cbc"


def available() -> bool:
    try:
        import pulp

        return bool(pulp.PULP_CBC_CMD(msg=False, _skip_v4_deprecation=True).available())
    except Exception:
        return False


def solve(problem: Problem, options: SolveOptions) -> RawResult:
    import pulp

    pro = prologue(problem, options, name)
    if pro.early is not None:
        return pro.early
    t0, model = pro.t0, pro.model
    prob, xs = build_pulp(model, "qsync_cbc")
    warm = pro.hint is not None
    if warm:
        for v, val in pro.hint.items():
            xs[v].setInitialValue(val, check=False)
    build_s = time.perf_counter() - t0
    fd, log_path = tempfile.mkstemp(suffix=".log", prefix="qsync_cbc_")
    os.close(fd)
    cbc_opts = [f"randomCbcSeed {max(1, options.seed)}", f"randomSeed {max(1, options.seed)}"]
    if options.formulation == "marginal":
        # CBC 2.10.3's integer preprocessing returns a wrong "optimal" on some marginal models
        # (random_small(99): 0.2712 vs the true 0.2479); without it the answers are exact.
        cbc_opts.append("preprocess off")
    solver = pulp.PULP_CBC_CMD(
        msg=False,
        timeLimit=seconds_left(options),  # after the build: see SolveOptions.deadline
        gapRel=options.rel_gap,
        threads=cbc_threads(options.threads),
        warmStart=warm,
        logPath=log_path,
        options=cbc_opts,
        _skip_v4_deprecation=True,
    )
    try:
        prob.solve(solver)
        log = open(log_path, encoding="utf-8", errors="replace").read()
    except pulp.PulpSolverError as e:
        return RawResult(name, "error", wall_s=time.perf_counter() - t0, message=str(e))
    finally:
        os.unlink(log_path)
    status = _status(prob.status, prob.sol_status, log)
    bound = _bound(log, status, prob)
    values = pulp_values(xs) if status in ("optimal", "feasible") else None
    res = result_from_values(name, problem, status, values, bound, time.perf_counter() - t0, warm_start_used=warm,
                             build_s=build_s, message=_result_line(log) or f"CBC gave no result line (PuLP status {prob.status})")
    res.extra["cbc_result"] = _result_line(log)
    if status == "optimal" and res.objective is not None:
        # CBC proved this on the same program in floating point, to within gapRel: that is
        # the bound it vouches for (its printed bound has too few digits to sign a 0 gap).
        res.bound = res.objective - options.rel_gap * abs(res.objective)
        res.gap = options.rel_gap
    return res


def cbc_threads(threads: int | None) -> int | None:
    """The `threads` to hand PuLP: None (CBC's serial code) for one thread. `-threads 1` does not mean serial
    to CBC: it starts its threaded branch-and-bound with one worker, whose master waits on the worker with a
    10-second timed wait (CbcThread::waitThread); a missed wake-up then stalls the solve 10 s with no CPU used
    and CBC reports "Stopped on time limit" (docs/rollout.md has the calls it stalled)."""
    return threads if threads is not None and threads > 1 else None


def _status(status: int, sol_status: int, log: str) -> str:
    """What CBC itself said. PuLP's status -1 also covers a run that printed nothing (seen at a
    1 s limit on a feasible 200-op DAG), so "infeasible" needs CBC's own result line to say so."""
    import pulp

    line = _result_line(log).lower()
    if sol_status == pulp.LpSolutionOptimal and "optimal" in line:
        return "optimal"
    if sol_status in (pulp.LpSolutionIntegerFeasible, pulp.LpSolutionOptimal):
        return "feasible"  # a plan, but no proof CBC's log confirms
    if "infeasible" in line:
        return "infeasible"
    return "unknown"  # stopped on a limit with no plan, or an empty/failed run: no proof either way


def _result_line(log: str) -> str:
    m = re.search(r"^Result - (.*)$", log, re.M)
    return m.group(1).strip() if m else ""


def _bound(log: str, status: str, prob) -> float | None:
    """CBC's 'Lower bound:' line, lowered by the last printed digit (CBC prints ~7 significant
    digits, and a rounded-up bound would claim more than was proven); None if absent.
    A proven optimum gets its bound from its own objective instead (see solve)."""
    m = re.search(r"^Lower bound:\s+(\S+)", log, re.M)
    return _printed_down(m.group(1)) if m else None


def _printed_down(text: str) -> float | None:
    m = re.fullmatch(r"([-+]?\d*)(?:\.(\d*))?(?:[eE]([-+]?\d+))?", text)
    if not m:
        return None
    value = float(text)
    if abs(value) >= 1e19:  # CBC's "infinity": no bound
        return None
    return value - 10.0 ** (int(m.group(3) or 0) - len(m.group(2) or ""))
