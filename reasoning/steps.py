"""What the step-level methods share: a model writing into a `multispec.Session` (so no context is ever
prefilled twice), stop rules, and the typed output.

A `Writer` is one model's session over the text so far. Token-level speculation is the session's: the
base model's writer may draft with the small model (`drafter=`, the combination SpecReason measures) or
with n-grams; `drafter=None` decodes one token per step through the same lean loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from multispec import Session
from multispec.drafters import NGramDrafter

SEPARATOR = "\n\n"


class Writer:
    """One model's session over the text (prompt included), greedy unless `sampling` says otherwise."""

    def __init__(self, model, drafter=None, tree=None, eos_token_id: int | Sequence[int] | None = None,
                 **sampling):
        if drafter is None:  # one token per step: a zero-length draft through the same loop
            drafter, tree = NGramDrafter(), 0
        self.session = Session(model, drafter, tree=tree, eos_token_id=eos_token_id, **sampling)
        self.eos = set(self.session.eos)
        self.tokens_written = 0  # tokens this model generated (not appended)

    def start(self, prompt: list[int]) -> None:
        self.session.append(torch.tensor([prompt]))

    @property
    def text(self) -> list[int]:
        return self.session.tokens[0]

    def write(self, max_new_tokens: int, stop: list[list[int]] | None = None) -> list[int]:
        """Up to `max_new_tokens` tokens, stopping after an EOS or a `stop` sequence (included)."""
        if max_new_tokens <= 0:
            return []
        out = self.session.generate(max_new_tokens, stop=stop)[0]
        self.tokens_written += len(out)
        return out

    def append(self, tokens: list[int]):
        """Text written by someone else (one pass; returns the session's `SpanScore` of it)."""
        return self.session.append(torch.tensor([tokens])) if tokens else None

    def checkpoint(self):
        return self.session.checkpoint()

    def rollback(self, mark) -> None:
        self.session.rollback(mark)

    def ends(self, tokens: list[int]) -> bool:
        return bool(tokens) and tokens[-1] in self.eos


@dataclass
class Step:
    """One step of the output: its tokens and text, who wrote it, and what the judging model said."""

    tokens: list[int]
    text: str
    author: str  # "small", "base" (SpecReason) or "large" (Speculative Thinking)
    score: float | None = None  # the base's score of the small model's draft of this step (SpecReason)
    rejected: str | None = None  # the small model's rejected draft of this step, if any
    kind: str = "step"  # Speculative Thinking: "paragraph", "lookahead", "takeover", "verify", "recap", "begin"


@dataclass
class ReasoningOutput:
    """The generated text (after the prompt), its steps, why it stopped and what it cost."""

    tokens: list[int]
    text: str
    steps: list[Step]
    stop_reason: str  # "finished" (answer or EOS), "budget", "repeated"
    seconds: float
    counters: dict = field(default_factory=dict)

    @property
    def tokens_by(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.steps:
            out[s.author] = out.get(s.author, 0) + len(s.tokens)
        return out

    @property
    def accepted_steps(self) -> int:
        return sum(1 for s in self.steps if s.author == "small" and s.score is not None)

    @property
    def rejected_steps(self) -> int:
        return sum(1 for s in self.steps if s.rejected is not None)


class Stops:
    """Stop rules shared by the step-level methods: a finished step (it contains one of `markers`, or ends in
    EOS), a step repeating the one before (`stop_on_repeat`), or the token budget."""

    def __init__(self, token_budget: int, markers: Sequence[str] = ("Answer:",), stop_on_repeat: bool = True):
        if not isinstance(token_budget, int) or token_budget < 1:
            raise ValueError(f"token_budget: expected a positive int, got {token_budget!r}")
        self.budget, self.markers, self.stop_on_repeat = token_budget, tuple(markers), stop_on_repeat

    def check(self, steps: list[Step], used: int, ended: bool) -> str | None:
        """The stop reason after the latest step (`used` tokens so far; `ended`: it ended in EOS), or None."""
        if ended or (steps and any(m in steps[-1].text for m in self.markers)):
            return "finished"
        if self.stop_on_repeat and len(steps) >= 2 and steps[-1].tokens == steps[-2].tokens:
            return "repeated"
        if used >= self.budget:
            return "budget"
        return None


def separator_ids(tokenizer, separator: str) -> list[int]:
    ids = tokenizer.encode(separator)
    if not ids:
        raise ValueError(f"separator: {separator!r} encodes to no tokens")
    return list(ids)
