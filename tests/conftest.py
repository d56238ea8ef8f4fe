import itertools
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from babygpt.model import PLACEMENTS, GPTConfig  # noqa: E402
from babygpt.norms import NORMS  # noqa: E402

GRID = list(itertools.product(PLACEMENTS, NORMS))  # every placement x norm_type
GRID_IDS = [f"{p}-{n}" for p, n in GRID]


def tiny_config(**overrides) -> GPTConfig:
    """2 layers, width 32: big enough to have every part of the model, small enough for CPU tests."""
    values = dict(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)
    values.update(overrides)
    return GPTConfig(**values)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
