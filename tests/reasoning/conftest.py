"""Tiny random byte-level Llamas sharing a vocabulary, the byte tokenizer, a prompt."""

import pytest
import torch

from multispec.testing import make_target
from reasoning_models import Tok


@pytest.fixture(scope="module")
def models():
    base = make_target("llama", seed=11, vocab=256, layers=3)
    small = make_target("llama", seed=12, vocab=256, layers=1)
    return base, small


@pytest.fixture(scope="module")
def tok():
    return Tok()


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(40, 120, (12,), generator=torch.Generator().manual_seed(0)).tolist()
