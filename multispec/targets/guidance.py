"""Classifier-free guidance as a target (and feeding-engine) wrapper.

Each row runs twice inside one batch of 2B: its conditional prompt (rows 0..B-1) and its unconditional
prompt (rows B..2B-1); every draft tree is scored in both halves and the loop sees one guided row,
`u + s * (c - u)` (the logits before the shared sampling transform, as `transformers`'
`ClassifierFreeGuidanceLogitsProcessor` computes them). Commits, selections and rollbacks move both
halves together, so each half's cache stays exactly what decoding that half alone would build.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..prompt import Prompt
from .base import NO_FEATURES, FeatureRequest, FeedingEngine, PrefillOutput, Target, TargetOutput
from .resolve import as_target


def _both(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t, t], dim=0)


class GuidedTarget(Target, FeedingEngine):
    """`inner` (a target adapter or a model `as_target` wraps) with classifier-free guidance at `scale`.

    `unconditional(prompt) -> Prompt` builds the unconditional prompts (same shape, ending on the same
    token); adapters that know their model's convention (Janus: every token but BOS and BOI replaced by
    the pad id) provide `unconditional_prompt` and it is the default."""

    def __init__(self, inner: Any, scale: float, unconditional: Callable[[Prompt], Prompt] | None = None):
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ValueError(f"guidance_scale: expected a positive number, got {scale!r}")
        self.inner = as_target(inner)
        if unconditional is None:
            unconditional = self.inner.unconditional_prompt
        if unconditional is None:
            raise ValueError(f"guidance_scale: {self.inner.describe()} does not say how to build an unconditional "
                             "prompt; pass unconditional=")
        self.scale = float(scale)
        self.unconditional = unconditional
        inner = self.inner  # the declared attributes of `Target`, as the inner adapter sets them
        self.name, self.vocab_size, self.device = inner.name, inner.vocab_size, inner.device
        self.model, self.shown_model = inner.model, inner.shown_model
        self.prefill_inputs, self.per_token_inputs = inner.prefill_inputs, inner.per_token_inputs
        self.appended_token_type, self.prompt_vocab_size = inner.appended_token_type, inner.prompt_vocab_size
        self.stop_token_ids, self.provides = inner.stop_token_ids, inner.provides

    @property
    def max_positions(self) -> int | None:
        return self.inner.max_positions

    def generation_defaults(self) -> tuple[tuple[int, ...], int | None]:
        return self.inner.generation_defaults()

    @property
    def batch_size(self) -> int:
        return self.inner.batch_size // 2

    @property
    def num_pending(self) -> int:
        return self.inner.num_pending

    def _guide(self, out: TargetOutput) -> TargetOutput:
        b = out.logits.shape[0] // 2
        cond, uncond = out.logits[:b], out.logits[b:]
        features = None if out.features is None else out.features.select(torch.arange(b, device=self.device))
        return TargetOutput(uncond + self.scale * (cond - uncond), features, out.extras)

    def _pair(self, prompt: Prompt) -> Prompt:
        uncond = self.unconditional(prompt)
        if not isinstance(uncond, Prompt) or uncond.input_ids.shape != prompt.input_ids.shape:
            raise ValueError("unconditional: must return a Prompt of the prompt's shape")
        if not torch.equal(uncond.input_ids[:, -1], prompt.input_ids[:, -1]):
            raise ValueError("unconditional: the unconditional prompt must end on the prompt's last token")
        inputs = {k: torch.cat([v, uncond.inputs[k]]) if isinstance(v, torch.Tensor) else v
                  for k, v in prompt.inputs.items()}
        return Prompt(torch.cat([prompt.input_ids, uncond.input_ids]),
                      torch.cat([prompt.attention_mask, uncond.attention_mask]), inputs)

    # ---- Target ---------------------------------------------------------------------------------------------
    def check_prompt(self, prompt: Prompt) -> None:
        self.inner.check_prompt(prompt)

    def check_request(self, request: FeatureRequest, who: str = "drafter") -> None:
        self.inner.check_request(request, who)

    def prefill(self, prompt: Prompt, request: FeatureRequest = NO_FEATURES) -> PrefillOutput:
        out = self.inner.prefill(self._pair(prompt), request)
        b = prompt.batch_size
        features = None if out.features is None else out.features.select(torch.arange(b, device=self.device))
        return PrefillOutput(out.roots[:b], features, out.extras)

    def score(self, tokens, parents, valid=None, request: FeatureRequest = NO_FEATURES) -> TargetOutput:
        return self._guide(self.inner.score(_both(tokens), _both(parents), None if valid is None else _both(valid),
                                            request))

    @property
    def accepts_host_counts(self) -> bool:
        return self.inner.accepts_host_counts

    def commit(self, path: torch.Tensor, counts: Sequence[int] | None = None) -> None:
        """Both halves move along the same path; `counts` (the host's, when the inner adapter takes them) twice."""
        if counts is None:
            self.inner.commit(_both(path))
        else:
            self.inner.commit(_both(path), counts=[*counts, *counts])

    def discard(self) -> None:
        self.inner.discard()

    def select(self, rows: torch.Tensor) -> None:
        self.inner.select(torch.cat([rows, rows + self.batch_size]))

    def checkpoint(self) -> Any:
        return self.inner.checkpoint()

    def rollback(self, state: Any) -> None:
        self.inner.rollback(state)

    # ---- FeedingEngine (a guided draft model) ---------------------------------------------------------------
    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PrefillOutput:
        return self.prefill(Prompt(input_ids, attention_mask))

    def feed(self, tokens, parents, valid=None) -> TargetOutput:
        if not isinstance(self.inner, FeedingEngine):
            raise TypeError(f"{self.name}: {type(self.inner).__name__} does not feed trees incrementally")
        return self._guide(self.inner.feed(_both(tokens), _both(parents), None if valid is None else _both(valid)))
