"""SpecReason (Pan et al. 2025): the small model writes each reasoning step, the base model scores it, and a
step whose score misses the threshold is written again by the base model.

On sessions: each model keeps its cache across steps, so no step re-reads the context. The base reads
the small model's step in one pass (which the scorer needs anyway: an accepted step is then already in its
cache); a rejected step is rolled back and the base writes its own from the same prefix, optionally with
token-level speculation (`base_drafter`, e.g. the small model: SpecReason+Decode), and the small model
reads the base's step in one pass. The scoring pass already holds the base's greedy choice at every
position of the draft, so a rejected step starts with the draft's prefix the base agrees with and the
base's own next token (unlike the reference, which throws the whole draft away): the same text the base
would have written, fewer base forwards.

Limits (tested): with a threshold above 9 every step is the base model's, so the text is the base model's
own greedy generation; with threshold 0 every step is the small model's, so the text is the small model's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .scoring import StepScorer, resolve_scorer
from .steps import SEPARATOR, ReasoningOutput, Step, Stops, Writer, separator_ids


@dataclass
class SpecReasonConfig:
    threshold: float = 7.0  # accept a step whose score is >= this (0-9 scale)
    separator: str = SEPARATOR  # the step delimiter (a stop sequence)
    max_step_tokens: int = 512
    token_budget: int = 8192
    first_n_steps_base: int = 0  # the first n steps are the base model's
    markers: tuple[str, ...] = ("Answer:",)  # a step containing one of these finishes the solution
    stop_on_repeat: bool = True  # stop when a step repeats the one before

    def __post_init__(self) -> None:
        if not isinstance(self.threshold, (int, float)):
            raise ValueError(f"threshold: expected a number on the 0-9 scale, got {self.threshold!r}")
        if not isinstance(self.max_step_tokens, int) or self.max_step_tokens < 1:
            raise ValueError(f"max_step_tokens: expected a positive int, got {self.max_step_tokens!r}")
        if not isinstance(self.first_n_steps_base, int) or self.first_n_steps_base < 0:
            raise ValueError(f"first_n_steps_base: expected an int >= 0, got {self.first_n_steps_base!r}")


class SpecReason:
    """`small` writes, `base` scores (with `scorer`) and rewrites rejected steps. Models share the tokenizer.

    `base_drafter` / `base_tree`: token-level speculation inside the base model's own steps (None: plain
    one-token decoding through the same loop). `keep_agreed`: a rejected step keeps the prefix of the small
    model's draft that the base agrees with (greedy: the same text the base would write; see `_rewrite`)."""

    def __init__(self, small, base, tokenizer, scorer: StepScorer | str = "prompt",
                 config: SpecReasonConfig | None = None, base_drafter=None, base_tree=None, keep_agreed: bool = True):
        check_same_vocab(small, base)
        self.small, self.base, self.tokenizer = small, base, tokenizer
        self.scorer = resolve_scorer(scorer, tokenizer)
        self.config = config or SpecReasonConfig()
        self.base_drafter, self.base_tree, self.keep_agreed = base_drafter, base_tree, keep_agreed
        self.sep = separator_ids(tokenizer, self.config.separator)
        self.eos = getattr(tokenizer, "eos_token_id", None)

    def run(self, prompt: str | list[int]) -> ReasoningOutput:
        c = self.config
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        t0 = time.perf_counter()
        small = Writer.open(self.small, eos_token_id=self.eos)
        base = Writer.open(self.base, self.base_drafter, self.base_tree, eos_token_id=self.eos)
        small.start(ids)
        base.start(ids)
        steps: list[Step] = []
        used, scored, accepted, kept = 0, 0, 0, 0
        score_s = 0.0
        stops = Stops(c.token_budget, c.markers, c.stop_on_repeat)
        while True:
            room = min(c.max_step_tokens, c.token_budget - used)
            if len(steps) < c.first_n_steps_base:
                tokens = base.write(room, [self.sep])
                small.append(tokens)
                step = Step(tokens, self.tokenizer.decode(tokens), "base")
            else:
                mark_small, mark_base = small.checkpoint(), base.checkpoint()
                draft = small.write(room, [self.sep])
                t1 = time.perf_counter()
                score = self.scorer.score(base, draft)  # appends the draft to the base's session
                score_s += time.perf_counter() - t1
                scored += 1
                if score >= c.threshold:
                    accepted += 1
                    tokens = draft
                    step = Step(tokens, self.tokenizer.decode(tokens), "small", score)
                else:
                    tokens, n_kept = self._rewrite(base, mark_base, draft, room)
                    kept += n_kept
                    small.rollback(mark_small)
                    small.append(tokens)
                    step = Step(tokens, self.tokenizer.decode(tokens), "base", score,
                                rejected=self.tokenizer.decode(draft))
            steps.append(step)
            used += len(step.tokens)
            reason = stops.check(steps, used, small.ends(step.tokens) or not step.tokens)
            if reason is not None:
                break
        tokens = [t for s in steps for t in s.tokens]
        counters = {"steps": len(steps), "scored": scored, "accepted": accepted, "rejected": scored - accepted,
                    "small_tokens_written": small.tokens_written, "base_tokens_written": base.tokens_written,
                    "base_tokens_kept_from_drafts": kept,
                    "score_s": round(score_s, 4)}
        return ReasoningOutput(tokens, self.tokenizer.decode(tokens), steps, reason, time.perf_counter() - t0, counters)

    def _rewrite(self, base, mark, draft: list[int], room: int) -> tuple[list[int], int]:
        """The base's own step after it rejected `draft`, and how many of its tokens came from the scoring
        pass. The scoring pass already gave the base's greedy
        choice at every draft position, so the prefix it agrees with plus its own next token is exactly what
        it would write first (greedy): that is kept (one pass to re-read it), and the base writes on from
        there. A kept text ending inside a multi-token separator is cut before it, so the base's stop
        check sees the whole separator."""
        scored = self.scorer.last_scores
        kept: list[int] = []
        if self.keep_agreed and scored is not None and scored.top_tokens is not None:
            top = scored.top_tokens[0].tolist()
            k = next((i for i, (d, t) in enumerate(zip(draft, top)) if d != t), len(draft))
            kept = draft[:k] + ([top[k]] if k < len(top) else [])
            kept = kept[:room]
            while kept and any(kept[-j:] == self.sep[:j] for j in range(1, len(self.sep))):
                kept.pop()
        base.rollback(mark)
        if not kept:
            return base.write(room, [self.sep]), 0
        base.append(kept)
        if len(kept) >= room or kept[-1] in base.eos or kept[-len(self.sep):] == self.sep:
            return kept, len(kept)
        return kept + base.write(room - len(kept), [self.sep]), len(kept)


def check_same_vocab(small, base) -> None:
    vs = getattr(getattr(small, "config", None), "vocab_size", None)
    vb = getattr(getattr(base, "config", None), "vocab_size", None)
    if vs is not None and vb is not None and vs != vb:
        raise ValueError(f"small: vocabulary size {vs} differs from the base model's {vb}; step-level speculation "
                         "appends one model's tokens to the other's context, so they must share a tokenizer")
