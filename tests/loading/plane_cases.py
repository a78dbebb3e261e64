"""A small two-source data plane shared by the tests (no torch import: the resume test's
subprocesses load it)."""

import numpy as np

from qsync_opt.loading.cost import CostModel
from qsync_opt.loading.plane import DataPlane, SourceIndex


def make_plane(**kw):
    rng = np.random.default_rng(0)
    short = SourceIndex("short", rng.integers(8, 64, 500).astype(np.int32), ((0, 3.0),))
    long = SourceIndex("long", rng.integers(200, 800, 97).astype(np.int32), ((0, 0.0), (10, 1.0)))
    args = dict(global_batch=16, speeds=[1.0, 0.5], cost=CostModel(a=1.0, b=0.01), seed=3)
    args.update(kw)
    return DataPlane([short, long], **args)
