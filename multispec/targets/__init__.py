"""Target adapters: prefill, score a draft tree in one forward, commit the accepted path.

The contract is `multispec.targets.base.Target`. Modality packages register adapters for model families
the core does not know (state-space and hybrid models, vision-language models, image generators) with
`register_target_adapter` when imported, and name themselves under the `multispec.adapters` entry-point
group of their distribution; the core imports them from there the first time a model matches no
registered adapter, so it never names a modality package.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from .base import (NO_FEATURES, FeatureRequest, Features, FeedingEngine, PrefillOutput, Target, TargetOutput)
from .guidance import GuidedTarget
from .hf import HFCausalLM, check_causal_lm

_ADAPTERS: list[tuple[Callable[[Any], bool], Callable[[Any], Any]]] = []
_SERVED: list[str] = []  # what the registered adapters say they drive, for refusals
_DRAFT_ENGINES: list[tuple[Callable[[Any], bool], Callable[[Any], Any]]] = []
PLUGIN_GROUP = "multispec.adapters"
_plugins_loaded = False


def load_adapter_plugins() -> None:
    """Import every package registered under the `multispec.adapters` entry-point group (once)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in entry_points(group=PLUGIN_GROUP):
        try:
            entry.load()
        except Exception as error:  # a broken plugin must not take the core down with it
            warnings.warn(f"multispec: the adapter plugin {entry.name!r} ({entry.value}) failed to load: {error}")


def register_target_adapter(matches: Callable[[Any], bool], factory: Callable[[Any], Any],
                            serves: str | None = None) -> None:
    """Route models for which `matches(model)` is true to `factory(model)` (checked before the default).
    `serves` names what it drives for users, e.g. "Mamba2ForCausalLM (mypackage)": a model that nothing can
    drive is refused with the list of these."""
    _ADAPTERS.insert(0, (matches, factory))
    if serves:
        _SERVED.append(serves)


def served_models() -> list[str]:
    """What the registered adapters drive (as they describe it), after loading the adapter plugins."""
    load_adapter_plugins()
    return list(_SERVED)


def register_draft_engine(matches: Callable[[Any], bool], factory: Callable[[Any], Any]) -> None:
    """Let `ModelDrafter` drive models for which `matches(model)` is true through `factory(model)`, a
    `FeedingEngine`."""
    _DRAFT_ENGINES.insert(0, (matches, factory))


def _registered(registry: list, model: Any) -> Any | None:
    """The first registered factory's product for `model` (the plugins are loaded when none matches)."""
    for attempt in range(2):
        for matches, factory in registry:
            if matches(model):
                return factory(model)
        if attempt or _plugins_loaded:
            break
        load_adapter_plugins()
    return None


def as_target(model: Any) -> Target:
    """Wrap `model` in its target adapter (a `Target` passes through unchanged)."""
    if isinstance(model, Target):
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


def registered_feeding_engine(model: Any) -> FeedingEngine | None:
    """A registered target adapter for `model` that also feeds trees incrementally (e.g. a VLM adapter, so
    a small VLM can draft with its images), else None."""
    if getattr(model, "_is_stateful", False):
        return None
    adapter = _registered(_ADAPTERS, model)
    return adapter if isinstance(adapter, FeedingEngine) else None


def stateful_draft_engine(model: Any) -> Any | None:
    """The registered feeding engine for a stateful draft model (None if the model is not stateful)."""
    if not getattr(model, "_is_stateful", False):
        return None
    engine = _registered(_DRAFT_ENGINES, model)
    if engine is None:
        check_causal_lm(model, "draft_model")  # raises: a recurrent state no package handles
    return engine


__all__ = ["NO_FEATURES", "FeatureRequest", "Features", "FeedingEngine", "GuidedTarget", "HFCausalLM", "PrefillOutput", "Target",
           "TargetOutput", "as_target", "check_causal_lm", "load_adapter_plugins", "register_draft_engine",
           "register_target_adapter", "registered_feeding_engine", "served_models", "stateful_draft_engine"]
