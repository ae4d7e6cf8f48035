"""Drafters: sources of draft trees for the verification loop."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel

from .base import Drafter
from .model import ModelDrafter
from .ngram import NGramDrafter
from .eagle import EagleConfig, EagleDrafter, EagleHead
from .hybrid import HybridDrafter


def as_drafter(drafter: Any) -> Drafter:
    """A `Drafter` as is; a `transformers` model -> `ModelDrafter`; "ngram" -> `NGramDrafter()`."""
    if isinstance(drafter, Drafter):
        return drafter
    if isinstance(drafter, PreTrainedModel):
        return ModelDrafter(drafter)
    if isinstance(drafter, str):
        if drafter.lower() in ("ngram", "prompt_lookup"):
            return NGramDrafter()
        raise ValueError(f"drafter: unknown drafter name {drafter!r}; expected 'ngram'")
    raise TypeError(
        f"drafter: expected a Drafter, a transformers PreTrainedModel or 'ngram', got {type(drafter).__name__}"
    )


__all__ = ["Drafter", "EagleConfig", "EagleDrafter", "EagleHead", "HybridDrafter", "ModelDrafter", "NGramDrafter", "as_drafter"]
