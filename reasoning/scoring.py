"""How the base model scores a step the small model wrote, on a 0-9 scale (SpecReason).

Both scorers append the step to the base model's writer (one pass over it: if the step is accepted it
is already in the base's cache) and return its score; the caller rolls back on rejection.

- `PromptScorer`, for instruction-tuned models: after the step, a judging prompt ("Evaluate the last
  reasoning step ... Assign a score from 0 to 9.") and the opening of the answer; one forward over the
  prompt (nothing committed) gives the next-token distribution, read at the ten digit tokens: `greedy`
  takes the argmax token (a non-digit scores 0, as the reference does), `expected` the mean digit under
  the digit probabilities renormalised (all ten: the reference only sees a top-10 list).
- `LogLikelihoodScorer`, for models that cannot follow such a prompt (the zoo's): how plausible the base
  finds the step itself. `min_ratio` (default) is 9 x min over the step's tokens of p(token) / p(the
  base's own choice there): 9 when every token is the base's own choice, near 0 when the base is sure of
  something else at some token (a wrong digit), and lenient to equivalent phrasings, where the base
  spreads its probability. `min_prob` is 9 x the smallest token probability, `mean` 9 x the geometric
  mean probability.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

DEFAULT_INSTRUCTION = ("Evaluate the last reasoning step solely based on factual correctness and logical validity. "
                       "Ignore style, phrasing, or overall usefulness—only judge whether the step is objectively "
                       "correct and logically follows from prior steps. Assign a score from 0 to 9.")
DEFAULT_LEAD = "I think the quality score is: "


class StepScorer:
    """Interface: `score(writer, step_tokens) -> float` in [0, 9]; appends the step to `writer`, and leaves
    the writer's scores of the step in `last_scores` (a `SpanScore`; None if the scorer does not read them)."""

    last_scores = None

    def score(self, writer, step: list[int]) -> float:
        raise NotImplementedError


class LogLikelihoodScorer(StepScorer):
    def __init__(self, reduce: str = "min_ratio"):
        if reduce not in ("min_ratio", "min_prob", "mean"):
            raise ValueError(f"reduce: expected 'min_ratio', 'min_prob' or 'mean', got {reduce!r}")
        self.reduce = reduce

    def __repr__(self) -> str:
        return f"LogLikelihoodScorer({self.reduce!r})"

    def score(self, writer, step: list[int]) -> float:
        if not step:
            self.last_scores = None
            return 9.0
        scored = self.last_scores = writer.append(step)
        logp, top = scored.logprobs[0], scored.top_logprobs[0]
        if self.reduce == "min_ratio":
            value = float((logp - top).min().exp())
        elif self.reduce == "min_prob":
            value = float(logp.min().exp())
        else:
            value = float(logp.mean().exp())
        return 9.0 * value


class PromptScorer(StepScorer):
    """Score by asking the base model. `suffix(step_text) -> token ids` builds the judging prompt that
    follows the step (`plain` and `chat` build the usual ones); `digits` are the token ids of "0".."9"."""

    def __init__(self, suffix: Callable[[], list[int]], digits: Sequence[int], method: str = "greedy"):
        if method not in ("greedy", "expected"):
            raise ValueError(f"method: expected 'greedy' or 'expected', got {method!r}")
        if len(digits) != 10 or len(set(digits)) != 10:
            raise ValueError(f"digits: expected the 10 distinct token ids of '0'..'9', got {list(digits)!r}")
        # on the host; `from_logits` moves them to the logits' device
        self.suffix, self.digits, self.method = suffix, torch.tensor(list(digits), device="cpu"), method

    @staticmethod
    def digit_ids(tokenizer) -> list[int]:
        ids = []
        for d in "0123456789":
            enc = tokenizer.encode(d, add_special_tokens=False) if _takes_special(tokenizer) else tokenizer.encode(d)
            if len(enc) != 1:
                raise ValueError(f"tokenizer: the digit {d!r} is not a single token ({enc}); a 0-9 score needs "
                                 "single-token digits")
            ids.append(enc[0])
        return ids

    @classmethod
    def plain(cls, tokenizer, method: str = "greedy", instruction: str = DEFAULT_INSTRUCTION,
              lead: str = DEFAULT_LEAD) -> "PromptScorer":
        """A plain-text judging prompt after the step: a blank line, the instruction, then `lead`."""
        ids = encode_text(tokenizer, f"\n\n{instruction}\n{lead}")
        return cls(lambda: ids, cls.digit_ids(tokenizer), method)

    @classmethod
    def chat(cls, tokenizer, question: str, steps_text: Callable[[], str], method: str = "greedy",
             instruction: str = DEFAULT_INSTRUCTION, lead: str = DEFAULT_LEAD,
             think: str = "<think>") -> "PromptScorer":
        """SpecReason's chat layout: [user: question, assistant: <think>steps] is the text so far; the suffix
        is what the tokenizer's chat template puts after it for [..., user: instruction, assistant: <think>
        lead] (the thinking left open, so the earlier steps stay visible). `steps_text()` returns the
        steps so far (the template is applied to them each call)."""
        def suffix() -> list[int]:
            base = [{"role": "user", "content": question}, {"role": "assistant", "content": think + steps_text()}]
            full = base + [{"role": "user", "content": instruction}, {"role": "assistant", "content": think + lead}]
            before = tokenizer.apply_chat_template(base, tokenize=False, continue_final_message=True)
            after = tokenizer.apply_chat_template(full, tokenize=False, continue_final_message=True)
            if not after.startswith(before):
                raise ValueError("tokenizer: its chat template rewrites earlier turns when a turn is added (e.g. "
                                 "it strips thinking); use PromptScorer.plain or a custom suffix")
            return encode_text(tokenizer, after[len(before):])

        return cls(suffix, cls.digit_ids(tokenizer), method)

    def __repr__(self) -> str:
        return f"PromptScorer({self.method!r})"

    def score(self, writer, step: list[int]) -> float:
        self.last_scores = writer.append(step) if step else None
        logits = writer.score(self.suffix()).next_logits[0].float()
        return self.from_logits(logits)

    def from_logits(self, logits: torch.Tensor) -> float:
        """The 0-9 score of next-token `logits` [V]."""
        digits = self.digits.to(logits.device)
        if self.method == "greedy":
            top = int(logits.argmax())
            hit = (digits == top).nonzero()
            return float(hit[0, 0]) if len(hit) else 0.0
        p = torch.softmax(logits[digits], dim=-1)
        return float((p * torch.arange(10, device=p.device, dtype=p.dtype)).sum())


def _takes_special(tokenizer) -> bool:
    import inspect

    try:
        return "add_special_tokens" in inspect.signature(tokenizer.encode).parameters
    except (TypeError, ValueError):
        return False


def encode_text(tokenizer, text: str) -> list[int]:
    if _takes_special(tokenizer):
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(text))


def resolve_scorer(scorer, tokenizer=None) -> StepScorer:
    """A `StepScorer` as is; "likelihood" (or "loglik") -> `LogLikelihoodScorer()`; "prompt" ->
    `PromptScorer.plain(tokenizer)`."""
    if isinstance(scorer, StepScorer):
        return scorer
    if scorer in ("likelihood", "loglik"):
        return LogLikelihoodScorer()
    if scorer == "prompt":
        if tokenizer is None:
            raise ValueError("scorer: 'prompt' needs the tokenizer")
        return PromptScorer.plain(tokenizer)
    raise ValueError(f"scorer: expected a StepScorer, 'likelihood' or 'prompt', got {scorer!r}")
