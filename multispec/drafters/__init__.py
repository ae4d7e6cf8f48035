"""Drafters: sources of draft trees for the verification loop."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel

from .base import Drafter
from .controlled import ControlledDrafter
from .model import ModelDrafter
from .ngram import NGramDrafter
from .eagle import EagleConfig, EagleDrafter, EagleHead
from .hybrid import HybridDrafter
from .recycling import TokenRecyclingDrafter
from .suffix import SuffixDecodingDrafter


def as_drafter(drafter: Any) -> Drafter:
    """A `Drafter` as is; a `transformers` model -> `ModelDrafter`; "ngram" -> `NGramDrafter()`;
    "recycling" -> `TokenRecyclingDrafter()`; "suffix" -> `SuffixDecodingDrafter()` (named drafters are
    fresh each call: keep an instance to carry their state across generations)."""
    if isinstance(drafter, Drafter):
        return drafter
    if getattr(drafter, "payload", None) == "continuous":
        raise TypeError(f"drafter: {type(drafter).__name__} drafts continuous vectors, not tokens; run it with "
                        "multispec.continuous.continuous_generate and a continuous target")
    if isinstance(drafter, PreTrainedModel):
        return ModelDrafter(drafter)
    if isinstance(drafter, str):
        named = {"ngram": NGramDrafter, "prompt_lookup": NGramDrafter, "recycling": TokenRecyclingDrafter,
                 "suffix": SuffixDecodingDrafter}
        if drafter.lower() in named:
            return named[drafter.lower()]()
        raise ValueError(f"drafter: unknown drafter name {drafter!r}; expected one of {sorted(named)}")
    raise TypeError(
        f"drafter: expected a Drafter, a transformers PreTrainedModel or a drafter name, got {type(drafter).__name__}"
    )


__all__ = ["ControlledDrafter", "Drafter", "EagleConfig", "EagleDrafter", "EagleHead", "HybridDrafter", "ModelDrafter", "NGramDrafter",
           "SuffixDecodingDrafter", "TokenRecyclingDrafter", "as_drafter"]
