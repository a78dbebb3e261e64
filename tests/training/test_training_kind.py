"""The training kind's record lists its run stages without importing the runtime: they must be the runner's."""

from __future__ import annotations

from qsync_opt.training import kind, run


def test_the_records_stage_names_are_the_runners_stages_in_order():
    assert kind.STAGE_NAMES == tuple(run.STAGES)
    assert kind.KIND.stages == tuple(run.STAGES)
