"""A diffusion-head AR model's transformer with its cache, run on both guidance halves: what the
continuous target, its drafters and plain sampling share."""

from __future__ import annotations

import torch

from .head_sampler import HeadConditions, HeadSampler
from .patch_ar import PatchAR


def split_halves(z: torch.Tensor, guided: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The conditional and the unconditional half of [cond rows; uncond rows] (None when unguided)."""
    if not guided:
        return z, None
    c, u = z.chunk(2)
    return c, u


class Runner:
    """A model's transformer with a cache, run on both guidance halves ([cond rows; uncond rows])."""

    def __init__(self, model: PatchAR, labels: torch.Tensor, sampler: HeadSampler):
        self.model, self.sampler = model, sampler
        self.guided = sampler.guided
        b = len(labels)
        self.labels = torch.cat([labels, torch.full_like(labels, model.null_class)]) if self.guided else labels
        self.cache = model.new_cache(len(self.labels))
        self.batch = b
        self.dim = model.config.token_dim

    def tokens(self, payload: torch.Tensor) -> torch.Tensor:
        """Emitted tokens (last states) of trajectory payloads [B, T, S*D], doubled for guidance."""
        x = payload[..., -self.dim:]
        return torch.cat([x, x]) if self.guided else x

    def start(self, payload: torch.Tensor | None) -> torch.Tensor:
        """Class + the tokens of `payload` (committed); returns their transformer outputs [2B or B, T, H]:
        the conditions z_0 .. z_T of the tokens after each."""
        tokens = None if payload is None else self.tokens(payload)
        z = self.model.transform(self.model.inputs(self.labels, tokens, 0), self.cache)
        self.cache.commit(z.shape[1])
        return z

    def feed(self, payload: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Transformer outputs [2B or B, T, H] of tokens at the cache's length + offset (not committed)."""
        start = self.cache.length + offset
        return self.model.transform(self.model.inputs(None, self.tokens(payload), start), self.cache, offset)

    def conditions(self, z: torch.Tensor) -> HeadConditions:
        """Head conditions of transformer outputs [2B or B, ..., H], rows flattened in (row, node) order."""
        c, u = split_halves(z, self.guided)
        flat = lambda t: None if t is None else t.reshape(-1, t.shape[-1])  # noqa: E731
        return self.sampler.conditions(flat(c), flat(u))
