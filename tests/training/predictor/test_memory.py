"""Memory model: a total by hand, precision scaling, followers and capacity."""

from __future__ import annotations

import pytest

from predictor_graphs import mlp_graph
from qsync_opt.errors import SpecError
from qsync_opt.training.predictor.followers import owners
from qsync_opt.training.predictor.memory import capacity_bytes, memory_model, op_memory_bytes

PS = ("fp32", "bf16", "int8", "int4")


def test_mlp_total_by_hand():
    g = mlp_graph()  # batch 16: fc1 64->128, relu, fc2 128->10; 9610 params
    m = memory_model(g, PS, "adam", world_size=2, owner=owners(g), backward_precision="bf16")
    assert m.breakdown == {
        "master_weights": 4 * 9610,
        "gradients": 4 * 9610,
        "optimizer_state": 8 * 9610,
        "ddp_buckets": 4 * 9610,
        "fixed_activations": 0,  # the relu follows fc1
        "workspace": 2 * 4 * 16 * 128,
    }
    assert m.fixed_bytes == 208_584
    # fc1 at bf16: saved input 4*16*64 at 16/32, weight copy 8320*2, relu's saved output at bf16
    assert m.op_bytes["fc1"]["bf16"] == 2048 + 16640 + 4096
    assert m.op_bytes["fc1"]["fp32"] == 4096 + 0 + 8192
    assert m.op_bytes["fc1"]["int8"] == 1024 + 8320 + 4096  # relu stays 16-bit behind an int8 op
    # int4 codes live in int8 tensors: saved input and weight copy at 8 bits, like int8
    assert m.op_bytes["fc2"]["int4"] == m.op_bytes["fc2"]["int8"] == 2048 + 1290
    assert m.total({"fc1": "bf16", "fc2": "int4"}) == 208_584 + 22_784 + 3_338


def test_without_owners_follower_activations_are_fixed_fp32():
    g = mlp_graph()
    m = memory_model(g, PS, "sgd", world_size=1)
    assert m.breakdown["fixed_activations"] == 4 * 16 * 128
    assert m.breakdown["optimizer_state"] == 0 and m.breakdown["ddp_buckets"] == 0
    assert m.op_bytes["fc1"]["bf16"] == 2048 + 16640


def test_lower_precision_never_needs_more_activation_memory():
    g = mlp_graph()
    for node in g.selectable:
        saved = [op_memory_bytes(node, p) - node.param_count * {"fp32": 0, "bf16": 2, "int8": 1, "int4": 1}[p] for p in PS]
        assert saved == sorted(saved, reverse=True)


def test_memory_scales_with_batch_but_weights_do_not():
    g = mlp_graph()
    a = memory_model(g, PS, "adam")
    b = memory_model(g.for_batch(64), PS, "adam")
    assert b.breakdown["master_weights"] == a.breakdown["master_weights"]
    assert b.op_bytes["fc2"]["fp32"] == 4 * a.op_bytes["fc2"]["fp32"]


def test_capacity_keeps_headroom():
    assert capacity_bytes(16e9) == pytest.approx(16e9 * 0.95 - 0.5e9)


def test_unknown_optimizer_is_a_spec_error():
    with pytest.raises(SpecError, match="training.optimizer: 'rmsprop'"):
        memory_model(mlp_graph(), PS, "rmsprop")
