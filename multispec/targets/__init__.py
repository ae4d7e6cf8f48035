"""Target adapters: prefill, score a draft tree in one forward, commit the accepted path.

Modality packages register adapters for model families the core does not know (e.g. state-space
models in `multispec.ssm`) with `register_target_adapter`; the core never imports them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .hf import HFCausalLM, check_causal_lm

_ADAPTERS: list[tuple[Callable[[Any], bool], Callable[[Any], Any]]] = []
_DRAFT_ENGINES: list[tuple[Callable[[Any], bool], Callable[[Any], Any]]] = []
# modality packages that register adapters when imported; loaded by name on first need, so the core does
# not depend on them (a stateful model, e.g. Mamba-2, loads multispec.ssm)
_PLUGINS = ("multispec.ssm",)


def register_target_adapter(matches: Callable[[Any], bool], factory: Callable[[Any], Any]) -> None:
    """Route models for which `matches(model)` is true to `factory(model)` (checked before the default)."""
    _ADAPTERS.insert(0, (matches, factory))


def register_draft_engine(matches: Callable[[Any], bool], factory: Callable[[Any], Any]) -> None:
    """Let `ModelDrafter` drive models for which `matches(model)` is true through `factory(model)`: an
    incremental feeding engine (`start`, `forward(tokens, parents, valid)`, `commit`, `discard`,
    `select`, `num_pending`, `vocab_size`, `device`, as `HFCausalLM` offers them)."""
    _DRAFT_ENGINES.insert(0, (matches, factory))


def _registered(registry: list, model: Any) -> Any | None:
    """The first registered factory's product for `model`; stateful models load the plugins first."""
    for attempt in range(2):
        for matches, factory in registry:
            if matches(model):
                return factory(model)
        if attempt or not getattr(model, "_is_stateful", False):
            break
        for name in _PLUGINS:
            importlib.import_module(name)
    return None


def as_target(model: Any) -> Any:
    """Wrap `model` in its target adapter (adapters pass through unchanged)."""
    if isinstance(model, HFCausalLM) or hasattr(model, "forward") and hasattr(model, "commit") and hasattr(model, "start"):
        return model
    adapter = _registered(_ADAPTERS, model)
    if adapter is not None:
        return adapter
    from .lean import LeanCausalLM, lean_unsupported
    from .lean_gemma import LeanGemma3CausalLM, lean_gemma_unsupported

    # Llama-family and Gemma 3 decoders run through a lean forward (same logits, a fraction of the per-call
    # cost); every other decoder through its own forward
    if lean_unsupported(model) is None:
        return LeanCausalLM(model, name="target")
    if lean_gemma_unsupported(model) is None:
        return LeanGemma3CausalLM(model, name="target")
    return HFCausalLM(model, name="target")


def stateful_draft_engine(model: Any) -> Any | None:
    """The registered feeding engine for a stateful draft model (None if the model is not stateful)."""
    if not getattr(model, "_is_stateful", False):
        return None
    engine = _registered(_DRAFT_ENGINES, model)
    if engine is None:
        check_causal_lm(model, "draft_model")  # raises: a recurrent state no package handles
    return engine


__all__ = ["HFCausalLM", "as_target", "check_causal_lm", "register_draft_engine", "register_target_adapter",
           "stateful_draft_engine"]
