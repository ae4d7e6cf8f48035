"""Which adapter drives a model: a registered one (a modality's), else the lean forwards for Llama-family
and Gemma 3 decoders, else `HFCausalLM`; and which engine feeds a model that drafts."""

from __future__ import annotations

from typing import Any

from .base import FeedingEngine, Target
from .hf import HFCausalLM, check_causal_lm, keeps_state
from .lean import LeanCausalLM, lean_unsupported
from .lean_gemma import LeanGemma3CausalLM, lean_gemma_unsupported
from .registry import ADAPTERS, DRAFT_ENGINES, registered


def as_target(model: Any) -> Target:
    """Wrap `model` in its target adapter (a `Target` passes through unchanged)."""
    if isinstance(model, Target):
        return model
    adapter = registered(ADAPTERS, model)
    if adapter is not None:
        return adapter
    # Llama-family and Gemma 3 decoders run through a lean forward (same logits, a fraction of the per-call
    # cost); every other decoder through its own forward
    if lean_unsupported(model) is None:
        return LeanCausalLM(model, name="target")
    if lean_gemma_unsupported(model) is None:
        return LeanGemma3CausalLM(model, name="target")
    return HFCausalLM(model, name="target")


def registered_feeding_engine(model: Any) -> FeedingEngine | None:
    """A registered target adapter for `model` that also feeds trees incrementally (e.g. a VLM adapter, so
    a small VLM can draft with its images), else None."""
    if keeps_state(model):
        return None
    adapter = registered(ADAPTERS, model)
    return adapter if isinstance(adapter, FeedingEngine) else None


def stateful_draft_engine(model: Any) -> Any | None:
    """The registered feeding engine for a stateful draft model (None if the model is not stateful)."""
    if not keeps_state(model):
        return None
    engine = registered(DRAFT_ENGINES, model)
    if engine is None:
        check_causal_lm(model, "draft_model")  # raises: a recurrent state no package handles
    return engine
