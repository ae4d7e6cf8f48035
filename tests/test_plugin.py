"""The subclass contract: a modality's classes override only public methods of the core's classes (the hooks
`HFCausalLM` and `StaticFeed` document), never a core class's private ones."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

MODALITIES = ("vision", "image_ar", "ssm", "reasoning")


def _is_core(cls: type) -> bool:
    module = cls.__module__
    return module.startswith("multispec") and not any(module.startswith(f"multispec.{m}") for m in MODALITIES)


def _private_overrides(classes) -> list[str]:
    """`module.Class._name` for every private method a class defines that a core base class also defines."""
    found = []
    for cls in classes:
        for name, value in vars(cls).items():
            if not name.startswith("_") or name.startswith("__") or not callable(value):
                continue
            if any(_is_core(base) and name in vars(base) for base in cls.__mro__[1:]):
                found.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    return found


def _modality_classes() -> list[type]:
    classes = []
    for modality in MODALITIES:
        package = importlib.import_module(f"multispec.{modality}")
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            classes += [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    return classes


def test_modalities_override_no_private_method_of_a_core_class():
    found = _private_overrides(_modality_classes())
    assert not found, "private core methods overridden by modality classes (make the hook public):\n" + "\n".join(found)


def test_the_override_check_finds_a_planted_one():
    from multispec.targets.hf import HFCausalLM

    class Planted(HFCausalLM):
        def _layer_masks(self, *args):  # a private method of HFCausalLM
            return None

        def node_positions(self, positions):  # a public hook: fine
            return positions

    Planted.__module__ = "multispec.vision.planted"
    assert _private_overrides([Planted]) == [f"multispec.vision.planted.{Planted.__qualname__}._layer_masks"]
