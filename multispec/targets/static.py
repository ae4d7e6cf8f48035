"""Which fixed-shape engine runs a pair under `EngineConfig(step="static" | "compiled")`: the hand-written lean
step (`static_step.StaticLeanCausalLM`) for the Llama-family decoders it serves, the model's own forward at
fixed shapes (`static_hf.StaticHFCausalLM`) for every other attention-cache decoder, and for a model a modality
adapter serves, that adapter with the matching static engine mixed in before it, where the adapter keeps the
engine's feed; classifier-free guidance (`GuidedTarget`) wraps the static engine of its model. Anything else is
refused by name. The engines are kept on the models they run, so buffers, compiled code and captured graphs
stay for the next call."""

from __future__ import annotations

import copy
from collections.abc import Callable

from transformers import PreTrainedModel

from ..config import STEPS
from .guidance import GuidedTarget
from .hf import HFCausalLM, check_causal_lm
from .lean import LeanCausalLM, lean_unsupported
from .registry import ADAPTERS, registered
from .static_hf import StaticFeed, StaticHFCausalLM, model_unsupported
from .static_step import StaticLeanCausalLM, capacity_for

# what an adapter may change for its feed to run at fixed shapes: positions (`_positions`), the prompt's prefill,
# `select`, attributes; one that changes any of these feeds otherwise (a recurrent state, masks or inputs of its
# own) is refused
FEED_HOOKS = ("feed", "_score", "_run", "_feed_unwindowed", "_first_read_column", "_layer_masks", "commit",
              "_move_columns", "_crop", "checkpoint", "rollback")
_VARIANTS: dict[type, type] = {}
# adapter classes whose modality brings its own fixed-shape engine: base class -> (adapter class -> engine class)
FIXED_SHAPE: dict[type, Callable[[type], type]] = {}


def register_fixed_shape(base: type, engine_for: Callable[[type], type]) -> None:
    """A modality's fixed-shape engines: for a model served by an adapter of class `base` (or a subclass),
    `engine_for(adapter class)` is the engine class (taking `(model, name=, capacity=, node_budget=,
    compile=)`)."""
    FIXED_SHAPE[base] = engine_for


def fixed_shape_class(model: object) -> type:
    """The fixed-shape engine class for `model` (see the module docstring); ValueError (TypeError for what is
    not a causal LM) naming the reason otherwise. An adapter standing in for a slower reference names it as
    `eager_class` (the static variant wraps the reference)."""
    adapter = registered(ADAPTERS, model) if isinstance(model, PreTrainedModel) else None
    own = next((make for base, make in FIXED_SHAPE.items() if isinstance(adapter, base)), None)
    if own is not None:
        if type(adapter) not in _VARIANTS:
            _VARIANTS[type(adapter)] = own(type(adapter))
        return _VARIANTS[type(adapter)]
    reason = model_unsupported(model)
    if reason is not None:
        raise ValueError(reason)
    if adapter is None:
        check_causal_lm(model, "target")
        return StaticLeanCausalLM if lean_unsupported(model) is None else StaticHFCausalLM
    base = getattr(type(adapter), "eager_class", None) or type(adapter)
    if not issubclass(base, HFCausalLM) or base.stateful:
        raise ValueError(f"{type(model).__name__} is served by {base.__name__}, which has no fixed-shape step")
    reference, engine = (LeanCausalLM, StaticLeanCausalLM) if issubclass(base, LeanCausalLM) else (HFCausalLM,
                                                                                                   StaticFeed)
    changed = [h for h in FEED_HOOKS if getattr(base, h) is not getattr(reference, h)]
    if changed:
        raise ValueError(f"{type(model).__name__} is served by {base.__name__}, whose feed is its own "
                         f"({', '.join(changed)}): no fixed-shape step yet")
    if base not in _VARIANTS:
        _VARIANTS[base] = type(f"Static{base.__name__}", (engine, base), {"__module__": __name__})
    return _VARIANTS[base]


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


__all__ = ["FEED_HOOKS", "FIXED_SHAPE", "fixed_shape_class", "generic_static_unsupported", "register_fixed_shape",
           "static_engines"]
