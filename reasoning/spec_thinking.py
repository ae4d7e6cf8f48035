"""Speculative Thinking (Yang et al. 2025): the small model writes; at reflective moments the large model
takes over for a short span.

At each step delimiter the small model writes a short look-ahead; if it holds a reflective keyword
(negative: "wait", "alternatively", ...; verify: "verify", "check", ...; positive: "yes", "final answer",
...), the look-ahead is dropped and the large model writes the next span from the delimiter instead
(`takeover_tokens`; None: up to the next delimiter), and after a verify keyword it writes
`verify_tokens` more. Counters as in the reference: negative spans accumulate, and after
`recap_after_negative` of them a recap prompt is inserted and the large model writes `recap_tokens`
(both thresholds then grow, up to their caps). Unlike the reference, a look-ahead that triggers
nothing is kept (the small model continues after it) instead of being thrown away and written again.

Both models keep sessions; the large model reads the small model's text lazily, in one pass whenever it is
called. Limits (tested): with a trigger that never fires the text is the small model's own greedy
generation; with one that always fires (and `begin`, spans up to the delimiter) it is the large model's.

Keyword matching is per word (the reference's substring test also matches "eyes" for "yes", "await" for
"wait"); `Triggers(substring=True)` restores it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .specreason import check_same_vocab
from .steps import SEPARATOR, ReasoningOutput, Step, Stops, Writer, separator_ids


@dataclass
class Triggers:
    """Reflective keyword sets and the sentiment rule: +1 more positive hits, -1 more negative (or verify)
    hits or a tie, 0 no keyword. `fires(text)`: any keyword."""

    negative: tuple[str, ...] = ("wait", "alternatively", "hold on", "another")
    verify: tuple[str, ...] = ("verify", "think again", "recap", "check")
    positive: tuple[str, ...] = ("yeah", "yes", "final answer", "confident")
    substring: bool = False
    rule: Callable[[str], int] | None = None  # overrides the keyword rule (e.g. always / never)

    @staticmethod
    def always() -> "Triggers":
        return Triggers(rule=lambda text: 1)

    @staticmethod
    def never() -> "Triggers":
        return Triggers(rule=lambda text: 0)

    def _count(self, text: str, words: Sequence[str]) -> int:
        text = text.lower()
        if self.substring:
            return sum(text.count(w) for w in words)
        return sum(len(re.findall(rf"(?<![a-z]){re.escape(w)}(?![a-z])", text)) for w in words)

    def sentiment(self, text: str) -> int:
        if self.rule is not None:
            return int(self.rule(text))
        pos = self._count(text, self.positive)
        neg = self._count(text, self.negative) + self._count(text, self.verify)
        if pos == neg == 0:
            return 0
        return 1 if pos > neg else -1

    def has_verify(self, text: str) -> bool:
        return self.rule is None and self._count(text, self.verify) > 0


@dataclass
class SpeculativeThinkingConfig:
    separator: str = SEPARATOR
    triggers: Triggers = field(default_factory=Triggers)
    lookahead_tokens: int = 20  # the small model's look-ahead after a delimiter
    takeover_tokens: int | None = 20  # the large model's span when triggered (None: up to the next delimiter)
    verify_tokens: int = 125  # more large-model tokens after a verify keyword
    choose_large: bool = True  # False: keep the small look-ahead when both agree in sentiment
    begin: bool = False  # the large model writes first
    begin_tokens: int | None = 100  # its first span (None: up to the first delimiter)
    recap_text: str | None = "Let me check whether there are some wrong steps:"
    recap_after_negative: int = 15
    recap_tokens: int = 125
    add_each_recap: int = 25
    add_each_negative: int = 5
    max_recap_tokens: int = 200
    max_negative: int = 30
    max_paragraph_tokens: int = 1024
    token_budget: int = 8192
    markers: tuple[str, ...] = ("Answer:",)
    stop_on_repeat: bool = True  # stop when a step repeats the one before

    def __post_init__(self) -> None:
        for name in ("lookahead_tokens", "verify_tokens", "recap_after_negative", "recap_tokens",
                     "max_paragraph_tokens", "token_budget"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        for name in ("takeover_tokens", "begin_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: expected a positive int or None (up to the delimiter), got {value!r}")


class SpeculativeThinking:
    """`small` writes, `large` takes over at reflective moments. Models share the tokenizer."""

    def __init__(self, small, large, tokenizer, config: SpeculativeThinkingConfig | None = None,
                 large_drafter=None, large_tree=None):
        check_same_vocab(small, large)
        self.small, self.large, self.tokenizer = small, large, tokenizer
        self.config = config or SpeculativeThinkingConfig()
        self.large_drafter, self.large_tree = large_drafter, large_tree
        self.sep = separator_ids(tokenizer, self.config.separator)
        self.eos = getattr(tokenizer, "eos_token_id", None)

    def run(self, prompt: str | list[int]) -> ReasoningOutput:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return _Run(self, ids).go()


class _Run:
    """One generation: both writers, the text the large model has not read yet, steps and counters."""

    def __init__(self, method: SpeculativeThinking, prompt: list[int]):
        self.m, self.c, self.tok, self.sep = method, method.config, method.tokenizer, method.sep
        self.t0 = time.perf_counter()
        self.small = Writer.open(method.small, eos_token_id=method.eos)
        self.large = Writer.open(method.large, method.large_drafter, method.large_tree, eos_token_id=method.eos)
        self.small.start(prompt)
        self.large.start(prompt)
        self.pending: list[int] = []  # text the small model has and the large model has not read yet
        self.steps: list[Step] = []
        self.used = 0
        self.stops = Stops(self.c.token_budget, self.c.markers, self.c.stop_on_repeat)
        self.n = {"triggers": 0, "takeovers": 0, "verify_spans": 0, "recaps": 0, "lookaheads_kept": 0,
                  "negative_spans": 0}

    def add(self, tokens: list[int], author: str, kind: str) -> str | None:
        """Record text both models now hold; the stop reason, if any."""
        self.steps.append(Step(tokens, self.tok.decode(tokens), author, kind=kind))
        self.used += len(tokens)
        return self.stops.check(self.steps, self.used, self.small.ends(tokens) or not tokens)

    def room(self, limit: int | None) -> int:
        return min(limit or self.c.max_paragraph_tokens, self.c.token_budget - self.used)

    def small_writes(self, limit: int | None, stop: bool) -> list[int]:
        tokens = self.small.write(self.room(limit), [self.sep] if stop else None)
        self.pending += tokens
        return tokens

    def large_writes(self, limit: int | None) -> list[int]:
        """The large model reads the pending text, writes `limit` tokens (None: up to the delimiter), and the
        small model reads them."""
        self.large.append(self.pending)
        self.pending = []
        tokens = self.large.write(self.room(limit), None if limit else [self.sep])
        self.small.append(tokens)
        return tokens

    def ends_at_separator(self, tokens: list[int]) -> bool:
        return len(tokens) >= len(self.sep) and tokens[-len(self.sep):] == self.sep

    def go(self) -> ReasoningOutput:
        c, n = self.c, self.n
        negative, recap_after, recap_tokens = 0, c.recap_after_negative, c.recap_tokens
        reason, at_separator = None, False
        if c.begin:
            tokens = self.large_writes(c.begin_tokens)
            reason = self.add(tokens, "large", "begin")
            at_separator = self.ends_at_separator(tokens)
        while reason is None:
            if not at_separator:  # the small model writes up to the next delimiter
                reason = self.add(self.small_writes(None, stop=True), "small", "paragraph")
                at_separator = True
                continue
            if c.recap_text and negative >= recap_after:  # a prompted recap, written by the large model
                text = self.tok.encode(c.recap_text)
                self.small.append(text)
                self.pending += text
                reason = self.add(text, "prompt", "recap")
                if reason is None:
                    reason = self.add(self.large_writes(recap_tokens), "large", "recap")
                n["recaps"] += 1
                negative = 0
                recap_tokens = min(recap_tokens + c.add_each_recap, c.max_recap_tokens)
                recap_after = min(recap_after + c.add_each_negative, c.max_negative)
                at_separator = False
                continue
            mark = self.small.checkpoint()
            look = self.small.write(self.room(c.lookahead_tokens))
            spe = c.triggers.sentiment(self.tok.decode(look))
            if spe == 0:  # nothing reflective: keep the look-ahead, the small model goes on after it
                self.pending += look
                n["lookaheads_kept"] += 1
                reason = self.add(look, "small", "lookahead")
                at_separator = self.ends_at_separator(look)
                continue
            n["triggers"] += 1
            self.small.rollback(mark)
            tokens, author = self.takeover(look, spe)
            reason = self.add(tokens, author, "takeover" if author == "large" else "lookahead")
            chosen = self.tok.decode(tokens)
            if c.triggers.sentiment(chosen) < 0:
                negative += 1
                n["negative_spans"] += 1
            if reason is None and author == "large" and c.triggers.has_verify(chosen):
                more = self.large_writes(c.verify_tokens)
                reason = self.add(more, "large", "verify")
                n["verify_spans"] += 1
                tokens = tokens + more
            at_separator = self.ends_at_separator(tokens)
        out = [t for s in self.steps for t in s.tokens]
        n |= {"small_tokens_written": self.small.tokens_written, "large_tokens_written": self.large.tokens_written}
        return ReasoningOutput(out, self.tok.decode(out), self.steps, reason, time.perf_counter() - self.t0, n)

    def takeover(self, look: list[int], spe: int) -> tuple[list[int], str]:
        """The large model's span from the delimiter; with `choose_large=False` it is kept only when its
        sentiment disagrees with the small look-ahead's, else the look-ahead (re-read by both) stands."""
        c = self.c
        if c.choose_large:
            self.n["takeovers"] += 1
            return self.large_writes(c.takeover_tokens), "large"
        self.large.append(self.pending)
        self.pending = []
        mark = self.large.checkpoint()
        tokens = self.large.write(self.room(c.takeover_tokens), None if c.takeover_tokens else [self.sep])
        tgt = c.triggers.sentiment(self.tok.decode(tokens))
        if (spe < 0 <= tgt) or (spe > 0 > tgt):
            self.small.append(tokens)
            self.n["takeovers"] += 1
            return tokens, "large"
        self.large.rollback(mark)
        self.small.append(look)
        self.pending += look
        return look, "small"
