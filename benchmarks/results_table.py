"""One way to write a benchmark's results CSV: the command that made it and the machine's load beside the table.

    # command: python benchmarks/<script> <its arguments>
    # load (1 min) <at the start> -> <at the end> on <N> CPUs; <UTC time written>
    <the table, csv.DictWriter>

The file is written whole or not at all (`qsync_opt.io.atomic_write_text`): a run stopped part-way leaves the
previous results file as it was. Used by the rollout benchmarks; the older scripts keep their own headers.
"""

from __future__ import annotations

import csv
import io
import os
import time
from pathlib import Path

from qsync_opt.io import atomic_write_text


def load_now() -> float:
    """The 1-minute load average now: read it at a run's start and pass it to `write_table`."""
    return os.getloadavg()[0]


def header_lines(script: str, argv, load_before: float) -> str:
    return (f"# command: python benchmarks/{script} {' '.join(argv)}".rstrip() + "\n"
            f"# load (1 min) {load_before:.2f} -> {load_now():.2f} on {os.cpu_count()} CPUs; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")


def write_table(path: "str | Path", script: str, argv, columns, rows, load_before: float) -> Path:
    """Write `rows` (dicts; a missing key is written empty, an unknown one is an error) under `columns` to `path`,
    after the command and load lines. Returns the path."""
    buf = io.StringIO()
    buf.write(header_lines(script, argv, load_before))
    w = csv.DictWriter(buf, fieldnames=list(columns), restval="", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, buf.getvalue())
    return path
