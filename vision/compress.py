"""What a VLM drafter sees of an image: the target's projected image embeddings, compressed.

- `QueryAdaptor` (ViSpec): learned queries cross-attend over an image's embeddings; with `num_queries` q it
  returns q outputs, of which ViSpec places the first q-1 in the draft sequence and keeps the last as a
  global image vector.
- `ElasticCompressor` (SpecVLM): per input, a gate that reads the image and the question picks one of four
  compressors (Gumbel-softmax while training, argmax at inference): pruning by a learned importance score,
  2-D average pooling and 2-D strided convolution over the patch grid, or a resampler (learned queries).
  A text-only branch (the image replaced by one learned marker) exists as an ablation; it joins the gate's
  choices only when asked for (`branches`), and is then reported as its own configuration.

All work on a batch of images padded to the longest, `embeds [B, N, H]` with `mask [B, N]` (True = a real
image token), and return token lists per row, since rows may keep different numbers of tokens. An image's
N tokens are taken as a square patch grid in raster order (side sqrt(N)), as a ViT tower emits them; a count
that is not a square is treated as one row of N patches (the 2-D compressors then work along that row).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

BRANCHES = ("prune", "pool", "conv", "resampler", "text")
COMPRESSORS = BRANCHES[:4]  # the gate's choices by default: every branch that keeps the image


def patch_grid(n: int) -> tuple[int, int]:
    """(rows, cols) of an image's n tokens: the square grid when n is a square, else a single row."""
    side = math.isqrt(n)
    return (side, side) if side * side == n else (1, n)


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
    """SpecVLM's elastic visual compressor: one of `branches` per image, picked by a question-conditioned gate.

    `ratio` is the compression of pruning, pooling and convolution: a square (4 = 2 x 2 windows on the patch
    grid; pruning keeps ceil(N / ratio) tokens). Pruning keeps the tokens a learned scorer rates most
    important for the question (the same rule in training and at inference, so drafts are deterministic);
    the kept tokens are scaled by 1 + s - stop_grad(s), s = sigmoid(score), which leaves their values
    unchanged and gives the scorer a gradient. Convolution starts as average pooling.
    The text-only branch keeps no image token; it emits one learned marker instead, so the draft knows
    the image was dropped and the gate's choice of it receives a gradient (straight-through)."""

    def __init__(self, hidden: int, heads: int, ratio: int = 4, resampler_queries: int = 2,
                 branches: tuple[str, ...] = COMPRESSORS):
        super().__init__()
        unknown = set(branches) - set(BRANCHES)
        if unknown or not branches:
            raise ValueError(f"branches: expected a non-empty subset of {BRANCHES}, got {branches}")
        window = math.isqrt(ratio) if ratio >= 1 else 0
        if ratio < 1 or window * window != ratio:
            raise ValueError(f"ratio: expected a square >= 1 (2-D windows of side sqrt(ratio)), got {ratio}")
        self.ratio, self.window, self.branches = ratio, window, tuple(branches)
        self.conv = nn.Conv2d(hidden, hidden, kernel_size=window, stride=window)
        with torch.no_grad():  # starts as average pooling
            self.conv.weight.copy_(torch.eye(hidden)[:, :, None, None].expand(-1, -1, window, window) / ratio)
            self.conv.bias.zero_()
        self.importance = nn.Linear(hidden, 1)  # a token's importance on its own ...
        self.importance_query = nn.Linear(hidden, hidden, bias=False)  # ... and for the question
        nn.init.zeros_(self.importance_query.weight)
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

    def choose(self, logits: torch.Tensor, tau: float = 1.0, gumbel: torch.Tensor | None = None) -> torch.Tensor:
        """One-hot [B, branches]: straight-through Gumbel-softmax in training (the value is one-hot, the
        gradient the soft sample's), argmax at inference. `gumbel` [B, branches]: the Gumbel noise, drawn by the
        caller (per row, so that it does not depend on the batch's split); None: drawn here."""
        if not self.training:
            return F.one_hot(logits.argmax(-1), len(self.branches)).to(logits.dtype)
        if gumbel is None:
            return F.gumbel_softmax(logits, tau=tau, hard=True)
        soft = ((logits + gumbel.to(logits)) / tau).softmax(-1)
        hard = F.one_hot(soft.argmax(-1), len(self.branches)).to(soft.dtype)
        return hard - soft.detach() + soft

    def importance_scores(self, image: torch.Tensor, question: torch.Tensor) -> torch.Tensor:
        """[n] scores of one image's tokens [n, H] for a question summary [H]."""
        query = self.importance_query(question.to(image.dtype))
        return self.importance(image)[:, 0] + image @ query / math.sqrt(image.shape[-1])

    def _grid(self, image: torch.Tensor) -> torch.Tensor:
        """[n, H] -> [1, H, rows, cols], padded (replicating the edge) to whole windows."""
        rows, cols = patch_grid(image.shape[0])
        grid = image.T.reshape(1, -1, rows, cols)
        w = self.window
        pad_r, pad_c = (-rows) % w if rows > 1 else 0, (-cols) % w
        return F.pad(grid, (0, pad_c, 0, pad_r), mode="replicate") if pad_r or pad_c else grid

    def branch(self, name: str, image: torch.Tensor, question: torch.Tensor) -> torch.Tensor:
        """One image's tokens [n, H] (and the question summary [H]) -> its compressed tokens [m, H]."""
        n = image.shape[0]
        if name == "prune":
            scores = self.importance_scores(image, question)
            idx = scores.topk(math.ceil(n / self.ratio)).indices.sort().values  # raster order kept
            s = torch.sigmoid(scores[idx])[:, None]
            return image[idx] * (1 + s - s.detach())
        if name in ("pool", "conv"):
            grid = self._grid(image)
            # a single row of patches (no square grid) pools along the row only
            kernel = (self.window if patch_grid(n)[0] > 1 else 1, self.window)
            if name == "pool":
                out = F.avg_pool2d(grid, kernel, kernel)
            else:
                weight = self.conv.weight if kernel[0] == self.window else self.conv.weight.sum(2, keepdim=True)
                out = F.conv2d(grid, weight, self.conv.bias, stride=kernel)
            return out.flatten(2)[0].T
        if name == "resampler":
            return self.resampler(image[None], torch.ones(1, n, dtype=torch.bool, device=image.device))[0]
        return self.text_marker.to(image.dtype)

    def forward(self, embeds: torch.Tensor, mask: torch.Tensor, question: torch.Tensor,
                tau: float = 1.0, gumbel: torch.Tensor | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Compressed tokens per row, and the gate's one-hot choice [B, branches] (`gumbel`: see `choose`)."""
        choice = self.choose(self.gate_logits(embeds, mask, question), tau, gumbel)
        out = []
        for r in range(embeds.shape[0]):
            k = int(choice[r].argmax())
            # times the chosen one-hot entry: 1 in value, the gate's gradient in training
            out.append(self.branch(self.branches[k], embeds[r, mask[r]], question[r]) * choice[r, k])
        return out, choice
