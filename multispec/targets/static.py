"""Which fixed-shape engine runs a pair under `EngineConfig(step="static" | "compiled")`: the hand-written lean
step (`static_step.StaticLeanCausalLM`) for the Llama-family decoders it serves, the model's own forward at
fixed shapes (`static_hf.StaticHFCausalLM`) for every other attention-cache decoder; any other target is
refused by name. The engines are kept on the models they run, so buffers, compiled code and captured graphs
stay for the next call."""

from __future__ import annotations

import copy

from transformers import PreTrainedModel

from ..config import STEPS
from .lean import LeanCausalLM, lean_unsupported
from .static_hf import fixed_shape_class
from .static_step import StaticLeanCausalLM, capacity_for


def static_engines(target, drafter, step: str, prompt_length: int, max_new_tokens: int, tree_nodes: int):
    """`EngineConfig.step` of `speculative_generate`: (target, drafter) on static engines ("static": the
    fixed-shape step as it is, captured in CUDA graphs on CUDA; "compiled": under `torch.compile` too). The
    engines are kept on the models they run and rebuilt with twice the capacity when a call needs more
    columns. Not for concurrent use of one model."""
    if step not in STEPS:
        raise ValueError(f"step: expected one of {', '.join(map(repr, STEPS))}, got {step!r}")
    model = target.model if isinstance(target, LeanCausalLM) else target
    if not isinstance(model, PreTrainedModel):
        raise ValueError(f"step: {step!r} runs `transformers` decoders; this target is a {type(model).__name__}; "
                         f"use step='eager'")
    engine = StaticLeanCausalLM
    if lean_unsupported(model) is not None:
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
        extra = dict(window=window) if engine is StaticLeanCausalLM else {}
        found = engine(model, name=name, capacity=capacity, **extra, **options)
        kept[key] = found
    return found


__all__ = ["static_engines"]
