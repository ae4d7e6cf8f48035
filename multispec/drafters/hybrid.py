"""Prompt lookup when the text repeats itself, a model drafter otherwise.

Code and documents copy from their own context (names, signatures, repeated blocks): there a prompt-
lookup chain is free and often long, while a small learned drafter guesses token by token. Elsewhere the
learned drafter wins. `HybridDrafter` asks the lookup first each step and falls back to the model.
"""

from __future__ import annotations

import torch

from ..prompt import Prompt
from ..rules import Verdict
from ..sampling import SamplingConfig
from ..targets.base import Features
from ..tree import Chain, DraftTree, TreeSpec
from .base import Drafter
from .model import ModelDrafter
from .ngram import NGramDrafter


class HybridDrafter(Drafter):
    """Each step: if the lookup drafter proposes, for every active row, a chain of at least `min_draft`
    tokens (up to `lookup_k`), draft that; otherwise let `model` draft with the step's tree spec. Lossless
    like any drafter: verification decides.

    `lookup`: the model-free drafter asked first; default prompt lookup (`NGramDrafter` matching at
    least `min_ngram`, at most `max_ngram` tokens); a `SuffixDecodingDrafter` also fits.
    `model` must support skipped steps (`supports_skipped_steps`: `EagleDrafter`, `ModelDrafter`,
    `TokenRecyclingDrafter`, `SuffixDecodingDrafter`): on a lookup step it drafts nothing (`skip(roots)`) and
    catches up on the committed tokens at its next draft.
    """

    def __init__(self, model: "Drafter | torch.nn.Module", lookup_k: int = 5, min_ngram: int = 2, max_ngram: int = 4,
                 min_draft: int = 2, lookup: Drafter | None = None):
        if isinstance(model, torch.nn.Module):  # a transformers draft model
            model = ModelDrafter(model)
        if not isinstance(model, Drafter):
            raise TypeError(f"model: expected a Drafter, got {type(model).__name__}")
        if not getattr(model, "supports_skipped_steps", False):
            raise TypeError(f"model: {type(model).__name__} cannot skip steps; use a drafter with "
                            "supports_skipped_steps (EagleDrafter, ModelDrafter)")
        for name, value in (("lookup_k", lookup_k), ("min_draft", min_draft)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if min_draft > lookup_k:
            raise ValueError(f"min_draft: {min_draft} exceeds lookup_k={lookup_k}")
        if lookup is not None and not isinstance(lookup, Drafter):
            raise TypeError(f"lookup: expected a Drafter, got {type(lookup).__name__}")
        self.model = model
        self.lookup = lookup if lookup is not None else NGramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
        self.observes_target = model.observes_target or self.lookup.observes_target
        self.lookup_k, self.min_draft = lookup_k, min_draft
        self.vocab_size = model.vocab_size
        self.feature_request = model.feature_request
        self.lookup_steps = 0  # steps drafted by lookup since `start`
        self.model_steps = 0
        self.supports_skipped_steps = self.lookup.supports_skipped_steps  # the model part always can

    def skip(self, roots: torch.Tensor) -> None:
        self.lookup.skip(roots)
        self.model.skip(roots)

    def start(self, prompt: Prompt, features: Features | None = None) -> None:
        self.lookup.start(prompt)
        self.model.start(prompt, features)
        self.lookup_steps = self.model_steps = 0

    def propose(self, roots: torch.Tensor, spec: TreeSpec, sampling: SamplingConfig,
                generator: torch.Generator | None = None) -> DraftTree:
        draft = self.lookup.propose(roots, Chain(self.lookup_k), sampling, generator)
        if bool((draft.valid.sum(dim=1) >= self.min_draft).all()):
            self.lookup_steps += 1
            self.model.skip(roots)
            return draft
        self.model_steps += 1
        return self.model.propose(roots, spec, sampling, generator)

    def observe(self, tokens: torch.Tensor, target_logits: torch.Tensor, valid: torch.Tensor) -> None:
        for part in (self.lookup, self.model):
            if part.observes_target:
                part.observe(tokens, target_logits, valid)

    def commit(self, draft: DraftTree, verdict: Verdict, features: Features | None = None) -> None:
        self.lookup.commit(draft, verdict)
        self.model.commit(draft, verdict, features=features)

    def select(self, rows: torch.Tensor) -> None:
        self.lookup.select(rows)
        self.model.select(rows)
