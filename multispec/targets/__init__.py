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
# modality packages that register adapters when imported; loaded by name on first need, so the core does
# not depend on them (a stateful model, e.g. Mamba-2, loads multispec.ssm)
_PLUGINS = ("multispec.ssm",)


def register_target_adapter(matches: Callable[[Any], bool], factory: Callable[[Any], Any]) -> None:
    """Route models for which `matches(model)` is true to `factory(model)` (checked before the default)."""
    _ADAPTERS.insert(0, (matches, factory))


def as_target(model: Any) -> Any:
    """Wrap `model` in its target adapter (adapters pass through unchanged)."""
    if isinstance(model, HFCausalLM) or hasattr(model, "forward") and hasattr(model, "commit") and hasattr(model, "start"):
        return model
    for attempt in range(2):
        for matches, factory in _ADAPTERS:
            if matches(model):
                return factory(model)
        if attempt or not getattr(model, "_is_stateful", False):
            break
        for name in _PLUGINS:
            importlib.import_module(name)
    return HFCausalLM(model, name="target")


__all__ = ["HFCausalLM", "as_target", "check_causal_lm", "register_target_adapter"]
