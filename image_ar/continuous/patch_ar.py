"""A class-conditional AR transformer over continuous patch tokens with a diffusion head (MAR-style, causal).

The image (28 x 28, pixels in [-1, 1]) is cut into `patch` x `patch` patches in raster order: L tokens of
dimension D = patch². Position 0 holds the class embedding (or the null class, for guidance); the output
at position i is the condition z_i of token i. Inputs are the emitted tokens, i.e. states at the stop
level of the head's trajectory (`diffusion_head`), which training reproduces by noising clean patches to
that level.

`PatchCache` keeps keys and values indexed by position: scoring writes past the committed length without
moving it, so a rejection is a smaller length (`commit(n)`), never a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from .diffusion_head import TRAIN_STEPS, diffusion_loss, make_head, schedule_scheduler


@dataclass
class PatchARConfig:
    num_classes: int = 10
    image_size: int = 28
    patch: int = 4
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    head_width: int = 128
    head_blocks: int = 2  # adaLN blocks ("adaln") or hidden layers ("lean")
    head_kind: str = "adaln"  # `diffusion_head.make_head`
    steps: int = 10  # grid points of the head's sampling trajectory
    stop: int = 50  # the stop level t_stop (the emitted token's noise level)

    @property
    def grid(self) -> int:
        return self.image_size // self.patch

    @property
    def tokens(self) -> int:
        return self.grid ** 2

    @property
    def token_dim(self) -> int:
        return self.patch ** 2


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """[B, H, W] -> [B, (H/p)(W/p), p²] in raster order."""
    b, h, w = images.shape
    x = images.reshape(b, h // patch, patch, w // patch, patch).permute(0, 1, 3, 2, 4)
    return x.reshape(b, (h // patch) * (w // patch), patch * patch)


def unpatchify(tokens: torch.Tensor, patch: int) -> torch.Tensor:
    b, n, _ = tokens.shape
    g = int(round(n ** 0.5))
    x = tokens.reshape(b, g, g, patch, patch).permute(0, 1, 3, 2, 4)
    return x.reshape(b, g * patch, g * patch)


class PatchCache:
    """Keys/values [layers, B, heads, max_len, head_dim] written by position; `length` positions committed."""

    def __init__(self, layers: int, batch: int, heads: int, max_len: int, head_dim: int, device, dtype):
        self.k = torch.zeros(layers, batch, heads, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def commit(self, n: int) -> None:
        if self.length + n > self.k.shape[3]:
            raise ValueError(f"n: committing {n} positions overflows the cache ({self.length}/{self.k.shape[3]})")
        self.length += n


def _block(model: nn.Module, i: int, h: torch.Tensor, attend) -> torch.Tensor:
    """Layer i of `model` on h [B, T, H]; `attend(i, q, k, v)` [B, heads, T, head_dim] -> attention output."""
    c = model.config
    b, t, _ = h.shape
    x = F.rms_norm(h, (c.hidden,), model.norm1[i].weight, model.norm1[i].eps)
    q, k, v = F.linear(x, model.qkv[i].weight).view(b, t, 3, c.heads, c.hidden // c.heads).permute(2, 0, 3, 1, 4)
    h = h + F.linear(attend(i, q, k, v).transpose(1, 2).reshape(b, t, c.hidden), model.proj[i].weight)
    x = F.rms_norm(h, (c.hidden,), model.norm2[i].weight, model.norm2[i].eps)
    return h + F.linear(F.gelu(F.linear(x, model.fc1[i].weight)), model.fc2[i].weight)


def run_layers(model: nn.Module, h: torch.Tensor, cache: PatchCache | None = None, offset: int = 0) -> torch.Tensor:
    """The causal pre-norm layers of `model` (its `norm1`, `qkv`, `proj`, `norm2`, `fc1`, `fc2` lists and
    `norm_out`; `model.config.hidden` / `.heads`) on inputs h [B, T, H] at positions cache.length + offset..
    Keys and values are written to `cache` without committing them. Shared by `PatchAR` and the draft
    `PatchEagle`, which differ in their inputs, not their layers."""
    t = h.shape[1]
    start = 0 if cache is None else cache.length + offset
    end = start + t
    mask = torch.ones(t, end, dtype=torch.bool, device=h.device).tril(start) if t > 1 or cache is None else None

    def attend(i, q, k, v):
        if cache is not None:
            cache.k[i, :, :, start:end] = k
            cache.v[i, :, :, start:end] = v
            k, v = cache.k[i, :, :, :end], cache.v[i, :, :, :end]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    for i in range(len(model.qkv)):
        h = _block(model, i, h, attend)
    return F.rms_norm(h, (model.config.hidden,), model.norm_out.weight, model.norm_out.eps)


def run_layers_at(model: nn.Module, h: torch.Tensor, cache: PatchCache, positions: torch.Tensor) -> torch.Tensor:
    """`run_layers` at fixed shapes (the continuous loop's static step): inputs h [B, T, H] at cache positions
    `positions` [T] (a tensor, so one captured graph serves every position), their keys and values written
    there; a query attends to every column at or before its position over the cache's whole capacity (the
    columns after it are masked, not sliced off). `cache.length` is neither read nor moved."""
    mask = torch.arange(cache.k.shape[3], device=h.device)[None] <= positions[:, None]  # [T, capacity]

    def attend(i, q, k, v):
        cache.k[i].index_copy_(2, positions, k)
        cache.v[i].index_copy_(2, positions, v)
        return F.scaled_dot_product_attention(q, cache.k[i], cache.v[i], attn_mask=mask)

    for i in range(len(model.qkv)):
        h = _block(model, i, h, attend)
    return F.rms_norm(h, (model.config.hidden,), model.norm_out.weight, model.norm_out.eps)


class PatchAR(nn.Module, PyTorchModelHubMixin):
    """Transformer + diffusion head. `config` is a `PatchARConfig` (or its dict)."""

    def __init__(self, config: PatchARConfig | dict | None = None, **kwargs):
        super().__init__()
        if config is None:
            config = PatchARConfig(**kwargs)
        elif isinstance(config, dict):
            config = PatchARConfig(**config)
        self.config = config
        c = config
        if c.image_size % c.patch:
            raise ValueError(f"patch: {c.patch} does not divide image_size {c.image_size}")
        if c.hidden % c.heads:
            raise ValueError(f"heads: {c.heads} does not divide hidden {c.hidden}")
        self.embed = nn.Linear(c.token_dim, c.hidden)
        self.classes = nn.Embedding(c.num_classes + 1, c.hidden)  # the last row: null class
        self.pos = nn.Parameter(torch.randn(c.tokens + 1, c.hidden) * 0.02)
        self.norm1 = nn.ModuleList(nn.RMSNorm(c.hidden) for _ in range(c.layers))
        self.qkv = nn.ModuleList(nn.Linear(c.hidden, 3 * c.hidden, bias=False) for _ in range(c.layers))
        self.proj = nn.ModuleList(nn.Linear(c.hidden, c.hidden, bias=False) for _ in range(c.layers))
        self.norm2 = nn.ModuleList(nn.RMSNorm(c.hidden) for _ in range(c.layers))
        self.fc1 = nn.ModuleList(nn.Linear(c.hidden, 4 * c.hidden, bias=False) for _ in range(c.layers))
        self.fc2 = nn.ModuleList(nn.Linear(4 * c.hidden, c.hidden, bias=False) for _ in range(c.layers))
        self.norm_out = nn.RMSNorm(c.hidden)
        self.head = make_head(c.head_kind, c.token_dim, c.hidden, c.head_width, c.head_blocks)

    @property
    def null_class(self) -> int:
        return self.config.num_classes

    # ---- transformer ----------------------------------------------------------------------------------

    def new_cache(self, batch: int, device=None, dtype=torch.float32, extra: int = 0) -> PatchCache:
        """Room for the class and every token, plus `extra` positions (a static step's chain past the end)."""
        c = self.config
        return PatchCache(c.layers, batch, c.heads, c.tokens + 1 + extra, c.hidden // c.heads,
                          device or self.pos.device, dtype)

    def inputs(self, labels: torch.Tensor | None, tokens: torch.Tensor | None, start: int) -> torch.Tensor:
        """Input embeddings at positions start.. : the class (at position 0, when `labels` is given) then tokens."""
        parts = []
        if labels is not None:
            parts.append(self.classes(labels)[:, None])
        if tokens is not None and tokens.shape[1]:
            parts.append(F.linear(tokens, self.embed.weight, self.embed.bias))
        h = torch.cat(parts, 1)
        return h + self.pos[start: start + h.shape[1]]

    def inputs_at(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Input embeddings of tokens [B, T, D] at positions [T] (a tensor); a position past the last token's
        (a static step's chain overhanging the image) takes the last position's embedding: what it computes
        is never emitted."""
        return F.linear(tokens, self.embed.weight, self.embed.bias) + self.pos[positions.clamp(max=len(self.pos) - 1)]

    def transform(self, h: torch.Tensor, cache: PatchCache | None = None, offset: int = 0) -> torch.Tensor:
        """Run the layers on inputs h [B, T, H] at positions cache.length + offset.. (causal over the cache
        and each other); keys/values are written to the cache without committing them. Returns z [B, T, H]."""
        return run_layers(self, h, cache, offset)

    # ---- training ---------------------------------------------------------------------------------------

    def loss(self, images: torch.Tensor, labels: torch.Tensor, class_dropout: float = 0.1,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """Diffusion loss of every token given the earlier tokens (noised to the stop level, as sampling
        feeds them) and the class (replaced by the null class with probability `class_dropout`)."""
        c = self.config
        x0 = patchify(images, c.patch)
        a = schedule_scheduler().alphas_cumprod[c.stop].to(x0.device)
        noisy = a.sqrt() * x0 + (1 - a).sqrt() * torch.randn(x0.shape, generator=generator, device=x0.device)
        drop = torch.rand(len(labels), generator=generator, device=labels.device) < class_dropout
        labels = torch.where(drop, torch.full_like(labels, self.null_class), labels)
        z = self.transform(self.inputs(labels, noisy[:, :-1], 0))
        return diffusion_loss(self.head, x0.reshape(-1, c.token_dim), z.reshape(-1, c.hidden), c.stop,
                              generator=generator)


def check_pair(target: PatchAR, draft: PatchAR) -> None:
    """A draft must share the target's tokenization and sampling grid."""
    for field in ("num_classes", "image_size", "patch", "steps", "stop"):
        if getattr(target.config, field) != getattr(draft.config, field):
            raise ValueError(f"draft: its {field} ({getattr(draft.config, field)}) differs from the target's "
                             f"({getattr(target.config, field)})")


__all__ = ["PatchAR", "PatchARConfig", "PatchCache", "TRAIN_STEPS", "check_pair", "patchify", "run_layers",
           "run_layers_at", "unpatchify"]
