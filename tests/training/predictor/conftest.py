"""Fixtures over the hand-built graphs in predictor_graphs.py."""

from __future__ import annotations

import pytest
import torch

from predictor_graphs import SPEC_V100_T4, conv_chain_graph, mlp_graph, residual_graph
from qsync_opt.training.spec import load_spec

@pytest.fixture
def mlp():
    return mlp_graph()


@pytest.fixture
def chain():
    return conv_chain_graph()


@pytest.fixture
def residual():
    return residual_graph()


@pytest.fixture
def v100_t4_spec():
    return load_spec(SPEC_V100_T4)


@pytest.fixture
def seeded():
    torch.manual_seed(0)
