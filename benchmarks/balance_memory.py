"""The memory of data-loading source state: replicated on every rank (each loader holds every source's index
and cursors) against the central data plane (one copy on the coordinator; a rank holds one step's ids and
lengths). Each role is measured as the RSS growth of a fresh Python process (median of 3) for a 1.5M-entry
index; benchmarks/balance.py reports it beside the balancing run.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RSS_CHILD = r"""
import sys, json
sys.path.insert(0, {root!r})
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) * 1024
import numpy as np
from qsync_opt.loading.plane import DataPlane, SourceIndex
from qsync_opt.loading.sources import SyntheticLM
from qsync_opt.loading.cost import CostModel
before = rss()
role = sys.argv[1]
if role == 'plane':  # what the central plane holds, and what each rank holds when it is replicated
    idx = [SourceIndex('short', SyntheticLM(num_samples=1_000_000, seed=0).lengths),
           SourceIndex('long', SyntheticLM(num_samples=500_000, median=640, max_len=1536, seed=1).lengths)]
    plane = DataPlane(idx, global_batch=64, speeds=[1.0] * 8, cost=CostModel(1.0, 0.01), backend=None)
    for _ in range(3):
        plan = plane.next_batch()
    keep = (idx, plane, plan)
else:  # a rank of the central design: its ids and lengths for one step
    plan = [(0, i, 100) for i in range(8)]
    keep = plan
print(json.dumps({{'rss_delta': rss() - before}}))
"""


def memory(world_sizes=(2, 8), reps: int = 3) -> list[dict]:
    """Per world size, the replicated and central state (MiB), each role's RSS growth the median of `reps` processes."""
    child = RSS_CHILD.format(root=str(ROOT))
    out = {}
    for role in ("plane", "rank"):
        vals = []
        for _ in range(reps):
            r = subprocess.run([sys.executable, "-c", child, role], capture_output=True, text=True, check=True)
            vals.append(int(json.loads(r.stdout.strip().splitlines()[-1])["rss_delta"]))
        out[role] = statistics.median(vals)
    rows = []
    for R in world_sizes:
        replicated = R * out["plane"]
        central = out["plane"] + R * out["rank"]
        rows.append({"ranks": R, "index_entries": 1_500_000, "per_process_state_mib": round(out["plane"] / 2**20, 2),
                     "rank_side_mib": round(out["rank"] / 2**20, 3), "replicated_mib": round(replicated / 2**20, 2),
                     "central_mib": round(central / 2**20, 2), "ratio": round(replicated / central, 2)})
    return rows
