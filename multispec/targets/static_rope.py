"""Dynamic NTK RoPE on the fixed-shape step.

`transformers`' dynamic rotary embedding keeps a state: before each forward it compares the longest position
seen (`max_seq_len_cached`, a Python number) with the call's and, on a host branch, recomputes its inverse
frequencies for a longer sequence ("growth") or restores the original ones when a call is shorter than the
original context again ("reset"). The same rule on tensors, so that a captured graph can run it: the state
(the frequencies and the longest length) enters the fixed-shape call as tensors, the patched forward picks the
grown, the original or the current frequencies with `torch.where` (the growth is `transformers`' NTK formula on
tensors, checked against it in tests/core/test_static_classes.py), and the new state comes out of the call and is written back to
the module, where its own eager code (the next prefill) finds it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel


def dynamic_rotary(model: PreTrainedModel):
    """The model's one dynamic-NTK rotary embedding module, or None; ValueError naming what it cannot run."""
    found = [m for m in model.modules() if getattr(m, "rope_type", None) == "dynamic"]
    if any(isinstance(getattr(m, "rope_type", None), dict) for m in model.modules()):
        typed = [m for m in model.modules() if isinstance(getattr(m, "rope_type", None), dict)
                 and "dynamic" in m.rope_type.values()]
        if typed:
            raise ValueError("rope_type 'dynamic' per layer type (one state per type): not on the fixed-shape step")
    if len(found) > 1:
        raise ValueError(f"{len(found)} dynamic rotary embeddings (one state each): not on the fixed-shape step")
    return found[0] if found else None


class DynamicRope:
    """The tensor form of one dynamic rotary embedding's update (see the module docstring)."""

    def __init__(self, rotary: torch.nn.Module):
        self.rotary = rotary
        self.rope_forward = inspect.unwrap(type(rotary).forward)  # the forward without the host-side update
        self.original = int(rotary.original_max_seq_len)
        config = rotary.config
        rope = config.rope_parameters
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
        self.theta, self.factor = float(rope["rope_theta"]), float(rope["factor"])
        self.context = int(config.max_position_embeddings)  # the length the growth formula scales from
        # the exponents, made here: no tensor is built from host values inside a captured call
        self.exponents = torch.arange(0, self.dim, 2, dtype=torch.int64).float().to(rotary.inv_freq.device) / self.dim

    def grown(self, seq_len: torch.Tensor) -> torch.Tensor:
        """`transformers`' dynamic NTK frequencies for a sequence of `seq_len` (a 0-d tensor) tokens, on tensors:
        base = theta ((factor max(seq_len, context) / context) - (factor - 1))^(dim / (dim - 2)), in float64 and
        then float32 as the eager code's Python float meets its float32 exponents."""
        longest = seq_len.double().clamp(min=self.context)
        base = self.theta * ((self.factor * longest / self.context) - (self.factor - 1)) ** (self.dim / (self.dim - 2))
        return 1.0 / (base.float() ** self.exponents.to(seq_len.device))

    def state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inverse frequencies, longest length seen as a 0-d int64 tensor) as the module holds them now."""
        inv = self.rotary.inv_freq
        cached = self.rotary.max_seq_len_cached
        if not isinstance(cached, torch.Tensor):
            cached = torch.full((), int(cached), dtype=torch.long, device=inv.device)
        return inv, cached

    def store(self, inv: torch.Tensor, cached: torch.Tensor) -> None:
        """Write a call's new state back to the module (copies: a graph's outputs are reused)."""
        self.rotary.register_buffer("inv_freq", inv.clone(), persistent=False)
        self.rotary.max_seq_len_cached = cached.clone()

    def updated(self, inv: torch.Tensor, cached: torch.Tensor, position_ids: torch.Tensor):
        """The frequencies and the longest length after a call at `position_ids`, as the eager update leaves them."""
        seq_len = position_ids.max() + 1
        grow = seq_len > cached
        reset = (seq_len < self.original) & (cached > self.original)
        new_inv = torch.where(grow, self.grown(seq_len).to(inv.dtype), torch.where(reset, self.rotary.original_inv_freq.to(inv), inv))
        new_cached = torch.where(grow, seq_len, torch.where(reset, torch.full_like(cached, self.original), cached))
        return new_inv, new_cached

    @contextmanager
    def patched(self, inv: torch.Tensor, cached: torch.Tensor) -> Iterator[dict]:
        """Within the block the module's forward runs the tensor update from state (`inv`, `cached`); the yielded
        dict then holds the new state ("inv", "cached")."""
        out: dict = {}
        rotary = self.rotary

        def forward(x, position_ids, **kwargs):
            out["inv"], out["cached"] = self.updated(inv, cached, position_ids)
            kept = rotary.inv_freq
            rotary.inv_freq = out["inv"]
            try:
                return self.rope_forward(rotary, x, position_ids, **kwargs)
            finally:
                rotary.inv_freq = kept

        rotary.forward = forward
        try:
            yield out
        finally:
            del rotary.forward


__all__ = ["DynamicRope", "dynamic_rotary"]
