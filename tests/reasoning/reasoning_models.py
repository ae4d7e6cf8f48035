"""Helpers of the reasoning tests: a byte tokenizer whose EOS is the tiny models', greedy reference text."""

import pytest
import torch

from multispec.testing import make_target
from multispec.zoo.bytes_lm import ByteTokenizer


class Tok(ByteTokenizer):
    eos_token_id = 2  # make_target's EOS


def greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=2)
    return out[0, len(prompt):].tolist()


def frequent(tokens: list[int]) -> int:
    """The ASCII token a model writes most often (a one-byte separator its text certainly contains)."""
    ascii_ = [t for t in tokens if t < 128]
    return max(set(ascii_), key=ascii_.count)


