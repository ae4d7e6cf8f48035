"""What a VLM drafter sees of an image: the target's projected image embeddings, compressed.

- `QueryAdaptor` (ViSpec): learned queries cross-attend over an image's embeddings; with `num_queries` q it
  returns q outputs, of which ViSpec places the first q-1 in the draft sequence and keeps the last as a
  global image vector.
- `ElasticCompressor` (SpecVLM): pruning, pooling, convolution, a two-query resampler, or nothing (text
  only), chosen per input by a gate that reads the question (Gumbel-softmax while training, argmax at
  inference).

All work on a batch of images padded to the longest, `embeds [B, N, H]` with `mask [B, N]` (True = a real
image token), and return token lists per row, since rows may keep different numbers of tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

BRANCHES = ("prune", "pool", "conv", "resampler", "text")


class QueryAdaptor(nn.Module):
    """`num_queries` learned queries, one cross-attention (k/v/o projections, `heads` heads) over the image."""

    def __init__(self, hidden: int, heads: int, num_queries: int):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"heads: {heads} does not divide the hidden size {hidden}")
        self.heads, self.head_dim = heads, hidden // heads
        self.queries = nn.Parameter(torch.randn(num_queries, heads, self.head_dim) * self.head_dim ** -0.5)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, N, H], [B, N] -> [B, num_queries, H]."""
        b, n, h = embeds.shape
        k = self.k_proj(embeds).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(embeds).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        q = self.queries.transpose(0, 1)[None].expand(b, -1, -1, -1).to(k.dtype)  # [B, heads, Q, d]
        bias = torch.zeros(b, 1, 1, n, dtype=k.dtype, device=k.device).masked_fill(~mask[:, None, None, :], -1e4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.o_proj(out.transpose(1, 2).reshape(b, -1, h))


class ElasticCompressor(nn.Module):
    """SpecVLM's dynamic selection: one of `BRANCHES` per image, picked by a question-conditioned gate.

    `ratio` is the compression of pruning, pooling and convolution (N tokens -> ceil(N / ratio)). Pruning
    drops random tokens while training and keeps evenly spaced ones at inference (deterministic drafts).
    The text-only branch keeps no image token; it emits one learned marker instead, so the draft knows
    the image was dropped and the gate's choice of it receives a gradient (straight-through)."""

    def __init__(self, hidden: int, heads: int, ratio: int = 4, resampler_queries: int = 2,
                 branches: tuple[str, ...] = BRANCHES):
        super().__init__()
        unknown = set(branches) - set(BRANCHES)
        if unknown or not branches:
            raise ValueError(f"branches: expected a non-empty subset of {BRANCHES}, got {branches}")
        if ratio < 1:
            raise ValueError(f"ratio: expected >= 1, got {ratio}")
        self.ratio, self.branches = ratio, tuple(branches)
        self.conv = nn.Conv1d(hidden, hidden, kernel_size=ratio, stride=ratio)
        with torch.no_grad():  # starts as average pooling
            self.conv.weight.copy_(torch.eye(hidden)[:, :, None].expand(-1, -1, ratio) / ratio)
            self.conv.bias.zero_()
        self.resampler = QueryAdaptor(hidden, heads, resampler_queries)
        self.text_marker = nn.Parameter(torch.zeros(1, hidden))
        self.gate = nn.Linear(2 * hidden, len(self.branches))
        nn.init.zeros_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    def gate_logits(self, embeds: torch.Tensor, mask: torch.Tensor, question: torch.Tensor) -> torch.Tensor:
        """[B, branches] from the mean image embedding and a question summary [B, H]."""
        m = mask[..., None].to(embeds.dtype)
        mean = (embeds * m).sum(1) / m.sum(1).clamp(min=1)
        return self.gate(torch.cat([mean, question.to(embeds.dtype)], -1))

    def choose(self, logits: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
        """One-hot [B, branches]: straight-through Gumbel-softmax in training (the value is one-hot, the
        gradient the soft sample's), argmax at inference."""
        if self.training:
            return F.gumbel_softmax(logits, tau=tau, hard=True)
        return F.one_hot(logits.argmax(-1), len(self.branches)).to(logits.dtype)

    def branch(self, name: str, image: torch.Tensor) -> torch.Tensor:
        """One image's tokens [n, H] -> its compressed tokens [m, H]."""
        n = image.shape[0]
        keep = math.ceil(n / self.ratio)
        if name == "prune":
            if self.training:
                idx = torch.randperm(n, device=image.device)[:keep].sort().values
            else:
                idx = torch.linspace(0, n - 1, keep, device=image.device).round().long()
            return image[idx]
        if name == "pool":
            return F.avg_pool1d(image.T[None], self.ratio, self.ratio, ceil_mode=True)[0].T
        if name == "conv":
            pad = keep * self.ratio - n
            x = F.pad(image.T[None], (0, pad), mode="replicate") if pad else image.T[None]
            return self.conv(x)[0].T
        if name == "resampler":
            return self.resampler(image[None], torch.ones(1, n, dtype=torch.bool, device=image.device))[0]
        return self.text_marker.to(image.dtype)

    def forward(self, embeds: torch.Tensor, mask: torch.Tensor, question: torch.Tensor,
                tau: float = 1.0) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Compressed tokens per row, and the gate's one-hot choice [B, branches]."""
        choice = self.choose(self.gate_logits(embeds, mask, question), tau)
        out = []
        for r in range(embeds.shape[0]):
            k = int(choice[r].argmax())
            # times the chosen one-hot entry: 1 in value, the gate's gradient in training
            out.append(self.branch(self.branches[k], embeds[r, mask[r]]) * choice[r, k])
        return out, choice
