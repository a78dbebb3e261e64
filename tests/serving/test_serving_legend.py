"""`qsync-opt solve` on a serving spec defines what it prints: each baseline with its paper, and the partition's
layers@bits notation, under the table that uses them."""

from __future__ import annotations

import io
import json

from rich.console import Console

from qsync_opt.cli.commands import main
from qsync_opt.serving.plan import ServingPlan
from qsync_opt.serving.report import print_serving_plan


def test_the_serving_tables_define_every_baseline_and_the_partition_notation(capsys):
    assert main(["solve", "examples/serving_opt30b_t4_v100.yaml", "--json"]) == 0
    plan = ServingPlan.model_validate(json.loads(capsys.readouterr().out))
    buf = io.StringIO()
    print_serving_plan(plan, Console(file=buf, width=1000))
    text = buf.getvalue()
    assert "pipeedge: PipeEdge (Hu et al., \"PipeEdge: Pipeline Parallelism for Large-Scale Model Inference on " \
           "Heterogeneous Edge Devices\", DSD 2022)" in text
    assert "adabits: AdaBits (Jin et al., \"AdaBits: Neural Network Quantization with Adaptive Bit-Widths\", " \
           "CVPR 2020)" in text
    assert "uniform: layers split evenly over the devices" in text and "plan: the planner's: LLM-PQ's" in text
    assert "partition: one entry per stage in pipeline order, layers@bits: 21@8/4 is 21 layers at 8 and 4 bits" in text
    for col in ("× best baseline", "e2e s", "Σω", "micro-batches", "search s", "bits", "memory GB"):
        assert f"\n{col}: " in text, col
