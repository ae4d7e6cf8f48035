"""What the step-level methods share: a model writing into a cache kept across steps (so no context is ever
prefilled twice), stop rules, and the typed output.

`Writer.open(model, drafter, tree)` gives one model's writer over the text so far:
- with a `drafter`, a `SessionWriter`: a `multispec.Session`, so the model's own text is written with
  token-level speculation (the base model drafted by the small model: the combination SpecReason measures);
- without, a `PlainWriter`: one token per forward on the same target adapter (lean forward, cache indexed
  by position) with no draft bookkeeping, since a model decoding alone gains nothing from it.
Both append text written elsewhere in one pass (returning its scores), score a span without committing it,
and roll back to a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from multispec import Prompt, SamplingConfig, Session, StoppingConfig
from multispec.plugin import DraftTree, SpanScore, as_target, check_logits_finite, checked, eos_ids

SEPARATOR = "\n\n"


class Writer:
    """Interface of one model writing into the text (prompt included); see the module docstring."""

    eos: frozenset[int] = frozenset()
    tokens_written: int = 0  # tokens this model generated (not appended)

    @staticmethod
    def open(model, drafter=None, tree=None, *, eos_token_id: int | Sequence[int] | None = None,
             sampling: SamplingConfig | None = None, generator: torch.Generator | None = None) -> "Writer":
        """`eos_token_id` None: the model's generation config's; `sampling` None: greedy."""
        if drafter is None:
            return PlainWriter(model, eos_token_id, sampling, generator)
        return SessionWriter(model, drafter, tree, eos_token_id, sampling, generator)

    def start(self, prompt: list[int]) -> None: ...

    @property
    def text(self) -> list[int]: ...

    def write(self, max_new_tokens: int, stop: list[list[int]] | None = None) -> list[int]:
        """Up to `max_new_tokens` tokens, stopping after an EOS or a `stop` sequence (included)."""

    def append(self, tokens: list[int]) -> SpanScore | None:
        """Text written by someone else, in one pass; its scores (None for no tokens)."""

    def score(self, tokens: list[int]) -> SpanScore:
        """The model's scores of a span after the text, and its logits after it; nothing is committed."""

    def checkpoint(self): ...

    def rollback(self, mark) -> None: ...

    def ends(self, tokens: list[int]) -> bool:
        return bool(tokens) and tokens[-1] in self.eos


class SessionWriter(Writer):
    """A writer on a `multispec.Session` with `drafter` (token-level speculation, lossless)."""

    def __init__(self, model, drafter, tree=None, eos_token_id: int | Sequence[int] | None = None,
                 sampling: SamplingConfig | None = None, generator: torch.Generator | None = None):
        self.session = Session(model, drafter, tree=tree, sampling=sampling, generator=generator,
                               stopping=StoppingConfig(eos_token_id=eos_token_id))
        self.eos = frozenset(self.session.eos)
        self.tokens_written = 0

    def start(self, prompt: list[int]) -> None:
        self.session.append(torch.tensor([prompt], device=self.session.target.device))

    @property
    def text(self) -> list[int]:
        return self.session.tokens[0]

    def write(self, max_new_tokens: int, stop: list[list[int]] | None = None) -> list[int]:
        if max_new_tokens <= 0:
            return []
        out = self.session.generate(max_new_tokens, stop=stop)[0]
        self.tokens_written += len(out)
        return out

    def append(self, tokens: list[int]) -> SpanScore | None:
        return self.session.append(torch.tensor([tokens], device=self.session.target.device)) if tokens else None

    def score(self, tokens: list[int]) -> SpanScore:
        return self.session.score(torch.tensor([tokens], device=self.session.target.device))

    def checkpoint(self):
        return self.session.checkpoint()

    def rollback(self, mark) -> None:
        self.session.rollback(mark)


class PlainWriter(Writer):
    """One token per forward on the model's target adapter: what a `Session` with a zero-length draft does,
    without the draft, verdict and statistics bookkeeping of every step."""

    def __init__(self, model, eos_token_id: int | Sequence[int] | None = None,
                 sampling: SamplingConfig | None = None, generator: torch.Generator | None = None):
        self.target = as_target(model)
        self.sampling = checked(sampling, SamplingConfig, "sampling")
        self.generator = generator
        self.eos = frozenset(eos_ids(eos_token_id) if eos_token_id is not None
                             else self.target.generation_defaults()[0])
        self.tokens: list[int] = []
        self.root: torch.Tensor | None = None
        self.tokens_written = 0
        self._who = f"model ({type(self.target.user_model).__name__})"

    def start(self, prompt: list[int]) -> None:
        if not prompt:
            raise ValueError("prompt: expected at least one token")
        ids = torch.tensor([prompt], device=self.target.device)
        self.root = self.target.prefill(Prompt.build(ids)).roots
        self.tokens = list(prompt)

    @property
    def text(self) -> list[int]:
        return self.tokens

    def _require_started(self) -> None:
        if self.root is None:
            raise RuntimeError("writer: start it with a prompt first")

    def _pass(self, span: list[int]) -> torch.Tensor:
        """Logits [1, 1 + len(span), V] after the root and each span token (the tree is pending)."""
        chain = DraftTree.chain(torch.tensor([span], dtype=torch.long, device=self.target.device))
        full = torch.cat([self.root[:, None], chain.tokens], 1)
        logits = self.target.score(full, chain.full_parents(), chain.full_valid()).logits
        check_logits_finite(logits, self._who)
        return logits

    @torch.no_grad()
    def write(self, max_new_tokens: int, stop: list[list[int]] | None = None) -> list[int]:
        self._require_started()
        stops = [tuple(s) for s in (stop or ())]
        path = torch.zeros(1, 1, dtype=torch.long, device=self.target.device)
        out: list[int] = []
        while len(out) < max_new_tokens:
            token, _ = self.sampling.pick(self._pass([])[:, 0], self.generator)
            self.target.commit(path)  # the root is now in the cache; the new token is the next root
            self.root = token.to(self.target.device)
            out.append(int(token[0]))
            self.tokens.append(out[-1])
            if out[-1] in self.eos or any(tuple(self.tokens[-len(s):]) == s for s in stops):
                break
        self.tokens_written += len(out)
        return out

    @torch.no_grad()
    def append(self, tokens: list[int]) -> SpanScore | None:
        self._require_started()
        if not tokens:
            return None
        logits = self._pass(tokens[:-1])
        n = len(tokens)
        self.target.commit(torch.arange(n, device=self.target.device)[None])
        self.root = torch.tensor([tokens[-1]], device=self.target.device)
        self.tokens.extend(tokens)
        return SpanScore.of(logits, torch.tensor([tokens], device=logits.device))

    @torch.no_grad()
    def score(self, tokens: list[int]) -> SpanScore:
        self._require_started()
        if not tokens:
            raise ValueError("tokens: expected a non-empty span")
        logits = self._pass(tokens)
        self.target.discard()
        return SpanScore.of(logits[:, :-1], torch.tensor([tokens], device=logits.device), logits[:, -1])

    def checkpoint(self):
        self._require_started()
        return len(self.tokens), self.root.clone(), self.target.checkpoint()

    def rollback(self, mark) -> None:
        length, root, state = mark
        self.target.rollback(state)
        del self.tokens[length:]
        self.root = root.clone()


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
