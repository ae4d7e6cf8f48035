"""The adapter registry: which adapter drives a model the core does not know, and the plugins that fill it.

Modality packages register their target adapters and draft engines here when imported, and name themselves
under the `multispec.adapters` entry-point group of their distribution; `registered` imports them from there
the first time a model matches nothing, so the core never names a modality package.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

PLUGIN_GROUP = "multispec.adapters"
Registry = list[tuple[Callable[[Any], bool], Callable[[Any], Any]]]
ADAPTERS: Registry = []
DRAFT_ENGINES: Registry = []
_SERVED: list[str] = []  # what the registered adapters say they drive, for refusals
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
    ADAPTERS.insert(0, (matches, factory))
    if serves:
        _SERVED.append(serves)


def register_draft_engine(matches: Callable[[Any], bool], factory: Callable[[Any], Any]) -> None:
    """Let `ModelDrafter` drive models for which `matches(model)` is true through `factory(model)`, a
    `FeedingEngine`."""
    DRAFT_ENGINES.insert(0, (matches, factory))


def served_models() -> list[str]:
    """What the registered adapters drive (as they describe it), after loading the adapter plugins."""
    load_adapter_plugins()
    return list(_SERVED)


def registered(registry: Registry, model: Any) -> Any | None:
    """The first registered factory's product for `model` (the plugins are loaded when none matches)."""
    for attempt in range(2):
        for matches, factory in registry:
            if matches(model):
                return factory(model)
        if attempt or _plugins_loaded:
            break
        load_adapter_plugins()
    return None
