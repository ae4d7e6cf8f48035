"""The prompt a target and a drafter receive: token ids, their mask, and the model's own prefill inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Prompt:
    """A left-padded batch of prompts.

    `input_ids` [B, L] and `attention_mask` [B, L] (1 = real token, padding on the left only);
    `inputs`: whatever else the model's forward takes at prefill, by its own argument names
    (`pixel_values`, `image_grid_thw`, `mm_token_type_ids`, class labels, ...). Targets say which of these
    they take (`Target.prefill_inputs`); drafters that only read tokens ignore them.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])

    @staticmethod
    def build(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **inputs: Any) -> "Prompt":
        """Validate and normalise: 1-D ids become one row, the mask defaults to all ones, ids become int64;
        bad shapes, a mask that is not 0/1 or pads on the right get a ValueError naming the argument."""
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"input_ids: expected a torch.Tensor, got {type(input_ids).__name__}")
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2 or input_ids.shape[1] == 0 or input_ids.shape[0] == 0:
            raise ValueError(
                f"input_ids: expected a non-empty [batch, length] tensor, got shape {tuple(input_ids.shape)}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids: expected an integer tensor, got {input_ids.dtype}")
        input_ids = input_ids.long()
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        else:
            if not isinstance(attention_mask, torch.Tensor):
                raise TypeError(f"attention_mask: expected a torch.Tensor, got {type(attention_mask).__name__}")
            if attention_mask.dim() == 1:
                attention_mask = attention_mask[None]
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f"attention_mask: shape {tuple(attention_mask.shape)} does not match input_ids "
                                 f"{tuple(input_ids.shape)}")
            attention_mask = attention_mask.long()
            if ((attention_mask != 0) & (attention_mask != 1)).any():
                raise ValueError("attention_mask: expected only 0 and 1 entries")
            if (attention_mask[:, 1:] < attention_mask[:, :-1]).any():
                raise ValueError("attention_mask: only left padding is supported (zeros before ones in every row)")
            if (attention_mask[:, -1] == 0).any():
                raise ValueError("attention_mask: every row needs at least one real token")
        inputs = {k: v for k, v in inputs.items() if v is not None}
        return Prompt(input_ids, attention_mask, inputs)

    def to(self, device: torch.device | str) -> "Prompt":
        """The same prompt with its ids, mask and tensor inputs on `device` (tensors already there are kept)."""
        moved = lambda v: v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
        return Prompt(moved(self.input_ids), moved(self.attention_mask), {k: moved(v) for k, v in self.inputs.items()})

    def text_only(self) -> "Prompt":
        """The same tokens without the model inputs (what a token-level drafter reads)."""
        return Prompt(self.input_ids, self.attention_mask)
