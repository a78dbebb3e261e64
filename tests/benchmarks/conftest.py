"""The benchmark scripts' smoke runs (test_smoke.py) start in one background lane as soon as the session is collected,
and their tests run last, when a second lane joins.

Most of the suite is single-threaded Python, so a lane of smoke scripts beside it runs on the core it leaves idle,
instead of making the suite wait for them (the measurement is in the commit that made it so); every smoke still runs
to completion and is checked by its own test. A session that ends early stops the lanes and the
scripts they started."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SMOKE_TEST = "test_script_runs_at_its_smoke_setting"

#: Started first, so that the lanes finish together.
SLOWEST = ["predictor.py", "predictor_cpu_tiny.py", "report_pictures.py", "serving_real.py", "rollout.py",
           "ddp_step_readings.py", "profile_speed.py", "emulated_hybrid.py", "plan_import_cost.py", "balance.py",
           "accuracy.py", "hf_models.py", "concurrency.py"]


def published() -> dict[str, tuple[int, int]]:
    """Size and mtime of every published figure (benchmarks/results, docs/img), which a smoke run must never touch."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for d in (BENCH / "results", ROOT / "docs" / "img")
            if d.exists() for p in sorted(d.rglob("*")) if p.is_file()}


class SmokeRuns:
    """The selected scripts' smoke runs, longest first, each `python benchmarks/X.py --smoke --out FOLDER/X` in its own
    process, taken from one queue by `lanes()` threads (most scripts are single-threaded)."""

    def __init__(self, scripts: list[str], folder: Path):
        order = sorted(scripts, key=lambda s: (s not in SLOWEST, SLOWEST.index(s) if s in SLOWEST else 0))
        self.queue, self.folder, self.published = deque(order), folder, published()
        self.futures: dict[str, Future] = {s: Future() for s in order}
        self.lock, self.procs, self.threads, self.stopped = threading.Lock(), set(), [], False

    def add_lanes(self, total: int) -> None:
        """Run `total` lanes from now on (never fewer than are running)."""
        while len(self.threads) < total:
            t = threading.Thread(target=self._lane, daemon=True, name=f"smoke-lane-{len(self.threads)}")
            self.threads.append(t)
            t.start()

    def result(self, script: str) -> tuple[subprocess.CompletedProcess, Path, float]:
        """(the finished process, its --out folder, its wall seconds)."""
        self.add_lanes(max(1, min(2, len(os.sched_getaffinity(0)))))  # the suite waits here: both cores are free
        return self.futures[script].result()

    def _lane(self) -> None:
        while True:
            with self.lock:
                if self.stopped or not self.queue:
                    return
                script = self.queue.popleft()
            try:
                self.futures[script].set_result(self._run(script))
            except BaseException as e:  # noqa: BLE001 (handed to the script's test, which reports it)
                self.futures[script].set_exception(e)

    def _run(self, script: str) -> tuple[subprocess.CompletedProcess, Path, float]:
        out = self.folder / script.removesuffix(".py")
        args = [sys.executable, str(BENCH / script), "--smoke", "--out", str(out)]
        t0 = time.perf_counter()
        with subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) as p:
            with self.lock:
                self.procs.add(p)
                if self.stopped:  # stop() came while it was starting
                    p.kill()
            try:
                stdout, stderr = p.communicate(timeout=600)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
                stderr += "\n(killed after 600 s)"
            finally:
                with self.lock:
                    self.procs.discard(p)
        return subprocess.CompletedProcess(args, p.returncode, stdout, stderr), out, time.perf_counter() - t0

    def changed_figures(self) -> list[str]:
        """The published figures that differ from when the runs started."""
        now = published()
        return sorted(k for k in set(now) | set(self.published) if now.get(k) != self.published.get(k))

    def stop(self) -> None:
        """No more scripts; kill the running ones (the session is over)."""
        with self.lock:
            self.stopped = True
            for p in self.procs:
                p.kill()
        for t in self.threads:
            t.join(timeout=30)


_runs: SmokeRuns | None = None


def _smoke_items(items) -> list:
    return [i for i in items if getattr(i, "originalname", "") == SMOKE_TEST]


def pytest_collection_modifyitems(session, config, items):
    """The smoke tests last: by then the background lane has run most of their scripts."""
    smoke = set(_smoke_items(items))
    if smoke:
        items[:] = [i for i in items if i not in smoke] + [i for i in items if i in smoke]


def pytest_collection_finish(session):
    """Start one lane of the selected smoke scripts (those another test does not run) beside the suite."""
    global _runs
    scripts = [i.callspec.params["script"] for i in _smoke_items(session.items)
               if i.callspec.params["script"] not in i.module.RUN_ELSEWHERE]
    if scripts and _runs is None and not session.config.option.collectonly:
        _runs = SmokeRuns(scripts, Path(tempfile.mkdtemp(prefix="qsync-smoke-")))
        _runs.add_lanes(1)


def pytest_sessionfinish(session, exitstatus):
    if _runs is not None:
        _runs.stop()
        shutil.rmtree(_runs.folder, ignore_errors=True)


@pytest.fixture(scope="session")
def smoke_runs() -> SmokeRuns:
    assert _runs is not None, "the smoke runs start when the session is collected (tests/benchmarks/conftest.py)"
    return _runs
