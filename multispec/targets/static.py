"""Which fixed-shape engine runs a pair under `EngineConfig(step="static" | "compiled")`: the hand-written lean
step (`static_step.StaticLeanCausalLM`) for the Llama-family decoders it serves, the model's own forward at
fixed shapes (`static_hf.StaticHFCausalLM`) for every other attention-cache decoder, and for a model a modality
adapter serves, the fixed-shape class written for that adapter class and registered with `register_fixed_shape`
(e.g. `class StaticLlavaTarget(StaticFeed, LlavaTarget)`: the adapter's own inputs and positions, the feed at fixed
shapes); classifier-free guidance (`GuidedTarget`) wraps the static engine of its model. Anything else is refused
by name: an adapter without a class of its own (a user's subclass of a served adapter included: the parent's
static class would drop its overrides). The engines are kept on the models they run, so buffers, compiled code and
captured graphs stay for the next call."""

from __future__ import annotations

import copy

from transformers import PreTrainedModel

from ..steps import STEPS
from .guidance import GuidedTarget
from .hf import check_causal_lm, keeps_state
from .lean import LeanCausalLM, lean_unsupported
from .registry import ADAPTERS, registered
from .static_hf import StaticHFCausalLM, model_unsupported
from .static_step import CapturedFeed, StaticLeanCausalLM, capacity_for

# an adapter class -> the fixed-shape class written for it (a subclass of it taking `(model, name=, capacity=,
# node_budget=, compile=)`); exact classes only
FIXED_SHAPE: dict[type, type] = {}


def register_fixed_shape(eager: type, static: type) -> None:
    """Models that the adapter class `eager` serves run at fixed shapes on `static`, the class written for it: a
    subclass of `eager` and of a fixed-shape feed (`StaticFeed`, `StaticLeanCausalLM`, a modality's own)."""
    if not isinstance(eager, type):
        raise TypeError(f"eager: expected an adapter class, got {eager!r}")
    if not isinstance(static, type) or not issubclass(static, eager) or not issubclass(static, CapturedFeed):
        name = eager.__name__
        raise TypeError(f"static: expected a fixed-shape subclass of {name} (e.g. class Static{name}(StaticFeed, "
                        f"{name})), got {static!r}")
    FIXED_SHAPE[eager] = static


def fixed_shape_class(model: object) -> type:
    """The fixed-shape engine class for `model` (see the module docstring); ValueError (TypeError for what is
    not a causal LM) naming the reason otherwise. An adapter standing in for a slower reference names it as
    `eager_class` (the static class of the reference serves it)."""
    adapter = registered(ADAPTERS, model) if isinstance(model, PreTrainedModel) else None
    reason = None if adapter is not None and keeps_state(model) else model_unsupported(model)
    if reason is not None:  # a recurrent state is refused only where no adapter brings an engine for it
        raise ValueError(reason)
    if adapter is None:
        check_causal_lm(model, "target")
        return StaticLeanCausalLM if lean_unsupported(model) is None else StaticHFCausalLM
    base = type(adapter).eager_class or type(adapter)
    engine = FIXED_SHAPE.get(base)
    if engine is None:
        raise ValueError(f"{type(model).__name__} is served by {base.__name__}, which has no fixed-shape class: "
                         f"write one for it (class Static{base.__name__}(StaticFeed, {base.__name__}) where it "
                         f"keeps the feed) and `register_fixed_shape({base.__name__}, Static{base.__name__})`")
    return engine


def generic_static_unsupported(model: object) -> str | None:
    """None if a fixed-shape engine runs `model` exactly as its eager feed does, else why not."""
    try:
        fixed_shape_class(model)
    except (TypeError, ValueError) as e:
        return str(e)
    return None


def static_engines(target, drafter, step: str, prompt_length: int, max_new_tokens: int, tree_nodes: int):
    """`EngineConfig.step` of `speculative_generate`: (target, drafter) on static engines ("static": the
    fixed-shape step as it is, captured in CUDA graphs on CUDA; "compiled": under `torch.compile` too). The
    engines are kept on the models they run and rebuilt with twice the capacity when a call needs more
    columns. Not for concurrent use of one model."""
    if step not in STEPS:
        raise ValueError(f"step: expected one of {', '.join(map(repr, STEPS))}, got {step!r}")
    if isinstance(target, GuidedTarget):  # both halves in one batch: the static engine of the guided model
        inner, drafter = static_engines(target.inner.user_model, drafter, step, prompt_length, max_new_tokens,
                                        tree_nodes)
        return GuidedTarget(inner, target.scale, target.unconditional), drafter
    model = target.model if isinstance(target, (LeanCausalLM, *FIXED_SHAPE)) else target
    if not isinstance(model, PreTrainedModel):
        raise ValueError(f"step: {step!r} runs `transformers` decoders; this target is a {type(model).__name__}; "
                         f"use step='eager'")
    try:
        engine = fixed_shape_class(model)
    except (TypeError, ValueError) as e:
        raise ValueError(f"step: {step!r} cannot run this target ({e}); use step='eager'") from None
    budget = max(8, 1 << tree_nodes.bit_length())  # a whole tree with its root in one padded call
    need = capacity_for(prompt_length, max_new_tokens, budget, draft_nodes=tree_nodes + 1)
    options = dict(node_budget=budget, compile=step == "compiled")
    static_target = _kept_engine(model, (step, budget, engine.__name__), need, engine, "target", None, options)
    lm = getattr(drafter, "lm", None)
    if type(lm) is LeanCausalLM:
        drafter = copy.copy(drafter)
        drafter.lm = _kept_engine(lm.model, (step, budget, "drafter"), static_target.capacity, StaticLeanCausalLM,
                                  lm.name, lm.window, options)
    return static_target, drafter


def _kept_engine(model: PreTrainedModel, key: tuple, need: int, engine: type, name: str, window: int | None,
                 options: dict):
    """The static engine kept on `model` under `key`, (re)built when missing or short of `need` columns."""
    kept = model.__dict__.setdefault("_multispec_static_engines", {})  # lives and dies with the model
    found = kept.get(key)
    if found is None or found.capacity < need or getattr(found, "window", None) != window:
        capacity = max(need, 2 * found.capacity if found is not None else 0)
        extra = dict(window=window) if issubclass(engine, StaticLeanCausalLM) else {}
        found = engine(model, name=name, capacity=capacity, **extra, **options)
        kept[key] = found
    return found


__all__ = ["FIXED_SHAPE", "fixed_shape_class", "generic_static_unsupported", "register_fixed_shape",
           "static_engines"]
